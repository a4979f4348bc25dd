// Minimal XLA FFI handlers (the typed C++ FFI API, as mpi4jax's handlers use), for
// benches/bench_ops.py: what one custom call costs in a jitted loop.
//   bench_noop       does nothing: XLA's floor for any custom call.
//   bench_allreduce  MPI_Allreduce(MPI_IN_PLACE) of float32 over a dup of MPI_COMM_WORLD,
//                    with no checks at all: the leanest possible XLA binding of one MPI op.
// Built by ci/bench.sh with the MPI compiler wrapper of the benchmarked MPI.
#include <mpi.h>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

static ffi::Error NoopImpl(ffi::AnyBuffer, ffi::Result<ffi::AnyBuffer>) {
  return ffi::Error::Success();
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(bench_noop, NoopImpl,
                              ffi::Ffi::Bind().Arg<ffi::AnyBuffer>().Ret<ffi::AnyBuffer>());

static MPI_Comm bench_comm() {
  static MPI_Comm comm = [] {
    MPI_Comm c;
    MPI_Comm_dup(MPI_COMM_WORLD, &c);
    return c;
  }();
  return comm;
}

// Call once from the main thread on every rank (MPI_Comm_dup is collective).
extern "C" void bench_ffi_init() { bench_comm(); }

static ffi::Error AllreduceImpl(ffi::AnyBuffer, ffi::Result<ffi::AnyBuffer> out) {
  MPI_Allreduce(MPI_IN_PLACE, out->untyped_data(), static_cast<int>(out->element_count()),
                MPI_FLOAT, MPI_SUM, bench_comm());
  return ffi::Error::Success();
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(bench_allreduce, AllreduceImpl,
                              ffi::Ffi::Bind().Arg<ffi::AnyBuffer>().Ret<ffi::AnyBuffer>());
