// Files and folders that appear whole or not at all: written under a temporary name in the same
// folder, flushed and fsync'ed, then renamed over the target (rename is atomic within a file
// system), and the folder fsync'ed so that the rename itself survives a power cut.
#pragma once

#include <string>

namespace pa {

// Writes `bytes` to `path` atomically. On any failure (a full disk, a folder that cannot be
// written, a file size limit) the temporary file is removed, `path` is left as it was, and
// UserError is thrown: "<path>: cannot write: <reason>".
void writeFileAtomically(const std::string& path, const std::string& bytes);

// fsyncs a folder (after a rename into it). Throws UserError naming the folder.
void syncFolder(const std::string& dir);

}  // namespace pa
