//! `run_on` over a fake GPU and a library whose host backend records the MPI calls made:
//! which failures every rank of a call learns before its MPI calls, and what a rank that
//! takes no verdict does instead.

use std::cell::RefCell;
use std::sync::atomic::Ordering;

use jaxmpi_core::{Backend, Buf, BufMut, Comm, Dtype, Error, Input, Peer, ReduceOp, Result};

use super::super::fake::FakeGpu;
use super::super::test_ranks::{Ranked, Recording};
use super::super::{GpuMemory, PinnedPool, Stats};
use super::run_on;

fn library() -> Ranked<Recording> {
    Ranked {
        rank: 0,
        size: 2,
        backend: Recording::default(),
    }
}

/// A sum of `data` (float32 "GPU" memory: the fake GPU's is host memory), in place.
fn allreduce(b: &dyn Backend, data: &mut [u8]) -> Result<()> {
    let data = BufMut::from_bytes(data, Dtype::F32)?;
    b.allreduce(Comm(0), Input::InPlace, data, ReduceOp::Sum)
}

/// What the failure XLA's stream left: a launch failure, sticky.
fn failed_stream() -> FakeGpu {
    let gpu = FakeGpu::default();
    gpu.fail_synchronize.store(true, Ordering::SeqCst);
    gpu
}

#[test]
fn a_failure_before_the_op_reaches_the_verdict_and_no_mpi_call_is_made() {
    let failed = failed_stream();
    let not_prepared = Error::invalid_argument("cuda", "the arrays are on GPU 1 (injected)");
    let cases: [(Result<&dyn GpuMemory>, &str); 2] = [
        (Ok(&failed), "CUDA_ERROR_LAUNCH_FAILED"),
        (Err(not_prepared), "on GPU 1"),
    ];
    for (gpu, why) in cases {
        let (lib, pool, stats) = (library(), PinnedPool::default(), Stats::default());
        let told = RefCell::new(Vec::new());
        let mut agree = |mine: Option<&Error>| {
            told.borrow_mut().push(mine.map(|err| err.message.clone()));
            mine.map_or(Ok(()), |err| Err(err.clone()))
        };
        let mut data = vec![0u8; 16];
        let err = run_on(gpu, &lib, &pool, &stats, Some(&mut agree), &mut |b| {
            allreduce(b, &mut data)
        })
        .unwrap_err();
        assert!(err.message.contains(why), "{err}");
        let told = told.into_inner();
        assert!(
            told.len() == 1 && told[0].as_ref().is_some_and(|m| m.contains(why)),
            "{told:?}"
        );
        assert_eq!(lib.backend.calls(), [], "{why}");
    }
}

#[test]
fn a_rank_told_another_cannot_start_makes_no_mpi_call_and_raises() {
    let (gpu, lib, pool, stats) = (
        FakeGpu::default(),
        library(),
        PinnedPool::default(),
        Stats::default(),
    );
    let mut agree = |mine: Option<&Error>| {
        assert!(mine.is_none());
        Err(Error::library("start verdict", "rank 1 could not start"))
    };
    let mut data = vec![0u8; 16];
    let err = run_on(Ok(&gpu), &lib, &pool, &stats, Some(&mut agree), &mut |b| {
        allreduce(b, &mut data)
    })
    .unwrap_err();
    assert!(err.message.contains("rank 1 could not start"), "{err}");
    assert_eq!(lib.backend.calls(), []);
}

#[test]
fn without_a_verdict_a_failed_stream_still_makes_the_ops_mpi_calls() {
    let (gpu, lib, pool, stats) = (
        failed_stream(),
        library(),
        PinnedPool::default(),
        Stats::default(),
    );
    let data = vec![7u8; 16];
    let err = run_on(Ok(&gpu), &lib, &pool, &stats, None, &mut |b| {
        let message = Buf::from_bytes(&data, Dtype::F32)?;
        b.send(Comm(0), message, Peer::Rank(1), 3)
    })
    .unwrap_err();
    assert!(err.message.contains("CUDA_ERROR_LAUNCH_FAILED"), "{err}");
    assert!(
        err.message.contains("still made the op's MPI calls"),
        "{err}"
    );
    assert_eq!(lib.backend.calls(), [("send", 4)]);
    // Host scratch memory went out, not the GPU buffer: nothing was copied from it.
    assert_eq!(gpu.bytes_to_host(), 0);
}

#[test]
fn the_verdict_comes_after_xlas_work_and_before_the_ops_mpi_calls() {
    let (gpu, lib, pool, stats) = (
        FakeGpu::default(),
        library(),
        PinnedPool::default(),
        Stats::default(),
    );
    let mut data = vec![0u8; 16];
    // Queued before the op, as XLA's kernels are: done by the time the ranks agree.
    gpu.zero_async(data.as_mut_ptr(), data.len()).unwrap();
    let mut agree = |mine: Option<&Error>| {
        assert!(mine.is_none());
        assert_eq!((gpu.pending(), lib.backend.calls()), (0, vec![]));
        Ok(())
    };
    run_on(Ok(&gpu), &lib, &pool, &stats, Some(&mut agree), &mut |b| {
        allreduce(b, &mut data)
    })
    .unwrap();
    assert_eq!(lib.backend.calls(), [("allreduce", 4)]);
    assert_eq!(stats.staged.load(Ordering::Relaxed), 1);
}
