// The prologue every kernel of ours begins with: programmatic dependent launch (PDL) on sm_90+.
/*
 * Note on programmatic dependent launch. The runtime launches our kernels on sm_90 and later with
 * CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION (runtime/cuda/launch.h), which lets a
 * kernel start before the previous kernel in its stream has finished; a captured CUDA graph keeps
 * that as a programmatic edge between the two kernel nodes. The rules this relies on:
 *
 *  - griddepcontrol.wait "causes the executing thread to wait until all prerequisite grids in
 *    flight have completed and all the memory operations from the prerequisite grids are
 *    performed and made visible to the current grid" (PTX ISA, griddepcontrol). With no
 *    prerequisite grid in flight (a plain launch, a kernel that follows a copy or a memset, the
 *    first node of a graph) it returns at once; on an sm_80 target it is compiled out.
 *  - A kernel launched with the attribute must wait before it touches memory the previous
 *    kernels write or read, whether or not they trigger: "If the primary kernel doesn't execute
 *    the trigger, it implicitly occurs after all thread blocks in the primary kernel exit. In
 *    either case, the secondary thread blocks might launch before data written by the primary
 *    kernel is visible" (CUDA Programming Guide, Programmatic Dependent Launch, API description).
 *    So the attribute is set only on kernels that begin with pdlBegin(), never on cuBLASLt's,
 *    NCCL's or a test's kernels.
 *  - Only a kernel can be a programmatic predecessor: the attribute overlaps a launch "with the
 *    previous kernel in the stream, if that kernel requests the overlap", and in a graph "only
 *    kernel nodes define non-zero ports"; an edge from a copy, memset, event or host node is a
 *    full dependency with memory visibility (CUDA driver API, CUgraphEdgeData::from_port).
 *  - griddepcontrol.launch_dependents lets the next kernel be scheduled "as soon as all other
 *    CTAs in the grid issue the same instruction or have completed" (PTX ISA). It says nothing
 *    about this kernel's memory, which is why the next kernel waits.
 *
 * Waiting first, in every thread, before any load or store, makes a kernel safe whatever precedes
 * it: a cuBLASLt or NCCL kernel (with or without a trigger), a copy, a memset, another of ours.
 * It also orders the whole chain: a kernel cannot complete before the one it waited on has, so
 * completion of the immediate predecessor implies completion of everything before it, and no
 * kernel writes while an earlier one may still read (no write-after-read race either). Triggering
 * right after the wait lets the next kernel's blocks be placed on free SMs while this one runs;
 * it cannot starve this kernel, since the trigger fires only once every block of this grid is
 * running or done. Nothing here changes what a kernel computes: a PDL and a plain run of a step
 * give the same bits (tests/gpu/graph_gpu_test.cpp).
 */
#pragma once

namespace pa {

// The first statement of every kernel of ours (codegen::beginsWithPdlPrologue checks it). The two
// statements are the CUDA runtime's cudaGridDependencySynchronize() and
// cudaTriggerProgrammaticLaunchCompletion() (cuda_device_runtime_api.h), written out because
// NVRTC compiles without the toolkit's headers; the wait's "memory" clobber keeps the compiler
// from moving loads and stores above it, and volatile keeps the two in this order.
__device__ __forceinline__ void pdlBegin() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}

}  // namespace pa
