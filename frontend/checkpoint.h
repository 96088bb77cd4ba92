// Checkpoints: a trained model and everything a bit-exact resume needs, as two safetensors files
// in one folder per step; and the weights files of --init-from and predict.
//
// Note on the layout (README "Save, resume, predict").
//   DIR/step-00000100/model.safetensors  the parameters: the graph's names and shapes, F32 (F64
//                                        for precision fp64); Linear weights [in, out] (x·W)
//   DIR/step-00000100/state.safetensors  exp_avg/<name>, exp_avg_sq/<name> (Adam's moments, as
//                                        the parameter), data.order (I64, the epoch's permutation),
//                                        data.rng (U64 [4], the batch generator); metadata: the
//                                        step, the schedule's length, epoch and position in it,
//                                        optimizer and schedule settings, the data's fingerprint,
//                                        the resolved config (YAML) and the project version
// A checkpoint is written into DIR/.tmp-step-...-<pid>, both files fsync'ed, and the folder
// renamed into place, so DIR only ever holds whole checkpoints; a crash leaves at most a
// temporary folder, which is never read and is removed by the next save into DIR (unless the
// process that made it still runs).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "frontend/config.h"
#include "frontend/safetensors.h"
#include "graph/graph.h"
#include "runtime/session.h"

namespace pa {

inline constexpr const char* kModelFile = "model.safetensors";
inline constexpr const char* kStateFile = "state.safetensors";

// What the run knows that a checkpoint records beside the session's state.
struct RunRecord {
  std::string configYaml;   // resolvedConfigYaml
  std::string configFile;   // the config's path, absolute: predict finds a CSV's data.path from it
  Precision precision = Precision::Fp32;
  int64_t totalSteps = 0;   // the schedule's length
  int64_t batchSize = 0;
  AdamSettings adam;
  LrSchedule schedule;
  std::vector<int64_t> sampleX, sampleY;  // one sample's input and target shapes
  int64_t trainSamples = 0;
  uint64_t dataFingerprint = 0;  // dataFingerprint() of the training split
  int fingerprintVersion = 2;    // 1: a checkpoint written before 2026-11-27 (dataFingerprintV1)
};

// A hash of the training split (inputs, then targets) in parallel: FNV-1a over each 1 MiB chunk
// of its bytes, then FNV-1a over the chunks' hashes and the two lengths. A resume on other data
// warns; ranks compare it.
uint64_t dataFingerprint(const std::vector<float>& x, const std::vector<float>& y);
// The fingerprint of checkpoints written before 2026-11-27 (FNV-1a over every byte, in order),
// computed only to compare with such a checkpoint.
uint64_t dataFingerprintV1(const std::vector<float>& x, const std::vector<float>& y);

// A checkpoint read back and checked.
struct Checkpoint {
  std::string folder;
  TrainingState state;
  std::map<std::string, std::vector<int64_t>> shapes;  // every parameter's shape
  RunRecord record;
  bool final = false;        // written at the end of a run that took all its steps
  std::string version;       // the project version that wrote it
};

// "step-00000100"
std::string checkpointFolderName(int64_t step);

// Writes the checkpoint of `state` (its parameters' shapes in `shapes`) as root/step-NNNNNNNN,
// replacing one of the same step; returns the folder. Throws UserError naming the file and the
// reason (a full disk, a folder that cannot be written); root then holds what it held before.
std::string writeCheckpoint(const std::string& root, const TrainingState& state,
                            const std::map<std::string, std::vector<int64_t>>& shapes, const RunRecord& record, bool final);

// Removes the oldest step checkpoints of `root` beyond the newest `keep` (0: keeps all); final
// ones stay. Returns the folders removed.
std::vector<std::string> pruneCheckpoints(const std::string& root, int64_t keep);

// The checkpoint folder `path` names: a checkpoint folder, a file in one, or a folder of
// checkpoints (the one of the highest step). Throws UserError "<flag> <path>: ...".
std::string findCheckpoint(const std::string& path, const std::string& flag);

// Reads and checks both files of a checkpoint folder. Throws UserError (safetensors::FormatError
// for damaged files) naming the file and the problem.
Checkpoint readCheckpoint(const std::string& folder);

// The first parameter in which `g` and a checkpoint's shapes differ, as "parameter 'x' is [2, 3]
// in this model and [3, 2] in the checkpoint"; "" when they hold the same names and shapes.
std::string firstParameterDifference(const Graph& g, const std::map<std::string, std::vector<int64_t>>& shapes);

// The keys whose values differ between two resolved configs (resolvedConfigYaml), as
// "train.optimizer.lr: 0.001 in the checkpoint, 0.0005 now"; left out are the model (its
// parameters decide whether it fits), the run's length (the caller compares schedules) and keys
// that do not change what a step computes (name, train.log_every, train.checkpoint).
std::vector<std::string> configDifferences(const std::string& checkpointYaml, const std::string& nowYaml);

// The config a checkpoint's weights file holds (metadata `config`), with `overrides` (--set)
// applied; relative data paths resolve against the folder of the config the run started with
// (metadata `config_file`). Throws UserError naming `flag` when the file holds none.
Config configFromWeights(const safetensors::Metadata& metadata, const std::string& file,
                         const std::vector<std::string>& overrides, const std::string& flag);

// A sample shape a weights file's metadata holds (`input_shape`, `target_shape`: "[64, 1]"), or {}
// when the key is absent. Throws safetensors::FormatError for a value that is no such shape.
std::vector<int64_t> metadataShape(const safetensors::File& f, const std::string& key);

// Parameter values for `g` from a safetensors file (--init-from, predict --weights): by name,
// floating-point tensors of the parameter's shape. Missing, extra, mis-shaped or non-float
// tensors throw one UserError listing them all (name, expected and found shape and dtype) unless
// `partial`: then the matching ones are returned and `report` lists the rest.
std::map<std::string, std::vector<double>> readWeights(const safetensors::File& file, const Graph& g, bool partial,
                                                       std::string* report, const std::string& flag);

}  // namespace pa
