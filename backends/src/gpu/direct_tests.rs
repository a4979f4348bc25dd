//! `Direct` on a fake GPU whose pointers are host memory, so that an MPI without CUDA
//! takes them: which ops go to MPI as they are, which are staged, and what a failing
//! GPU makes of them. Real MPI at 1 rank (`test_mpi.rs`).

use std::sync::atomic::Ordering;

use jaxmpi_core::{Backend, Broadcast, Buf, BufMut, Dtype, Envelope, Input, Peer, ReduceOp};

use super::super::fake::FakeGpu;
use super::super::test_mpi::{count, failed_sum, floats, input, mpi, output};
use super::super::{PinnedPool, Stats};
use super::{Direct, Placement};

#[test]
fn direct_stages_reductions_that_run_host_code_and_passes_the_rest() {
    let Some(mpi) = mpi() else { return };
    let (gpu, pool, stats) = (FakeGpu::default(), PinnedPool::default(), Stats::default());
    let direct = Direct::new(mpi, &gpu, &pool, &stats, Placement::Any);
    let halves: Vec<u8> = [1.5f32, -2.0]
        .iter()
        .flat_map(|&v| half::f16::from_f32(v).to_ne_bytes())
        .collect();
    let mut out = vec![0u8; halves.len()];
    direct
        .allreduce(
            mpi.world(),
            Input::Data(Buf::from_bytes(&halves, Dtype::F16).unwrap()),
            BufMut::from_bytes(&mut out, Dtype::F16).unwrap(),
            ReduceOp::Sum,
        )
        .unwrap();
    assert_eq!(out, halves);
    assert_eq!(
        (
            count(&stats.staged_host_code),
            count(&stats.staged),
            count(&stats.direct)
        ),
        (1, 1, 0)
    );
    let send = floats([1.0, 2.0]);
    let mut recv = vec![0u8; send.len()];
    direct
        .allreduce(
            mpi.world(),
            Input::Data(input(&send)),
            output(&mut recv),
            ReduceOp::Sum,
        )
        .unwrap();
    assert_eq!(recv, send);
    assert_eq!((count(&stats.staged), count(&stats.direct)), (1, 1));
    // MIN/MAX on float32 are jaxmpi's own ops (they propagate NaN): host code too.
    let mut recv = vec![0u8; send.len()];
    direct
        .allreduce(
            mpi.world(),
            Input::Data(input(&send)),
            output(&mut recv),
            ReduceOp::Max,
        )
        .unwrap();
    assert_eq!(recv, send);
    assert_eq!(
        (
            count(&stats.staged_host_code),
            count(&stats.staged),
            count(&stats.direct)
        ),
        (2, 2, 1)
    );
}

#[test]
fn decided_automatically_direct_stages_buffers_ipc_cannot_share() {
    let Some(mpi) = mpi() else { return };
    let (gpu, pool, stats) = (FakeGpu::default(), PinnedPool::default(), Stats::default());
    gpu.ipc_capable.store(false, Ordering::SeqCst);
    let send = floats([3.0, 4.0]);
    for (placement, direct_calls) in [(Placement::IpcShareable, 0), (Placement::Any, 1)] {
        let before = count(&stats.direct);
        let direct = Direct::new(mpi, &gpu, &pool, &stats, placement);
        let mut recv = vec![0u8; send.len()];
        direct
            .bcast(mpi.world(), Broadcast::Root(input(&send)), 0)
            .unwrap();
        direct
            .allgather(mpi.world(), input(&send), output(&mut recv))
            .unwrap();
        assert_eq!(recv, send);
        assert_eq!(
            count(&stats.direct) - before,
            2 * direct_calls,
            "{placement:?}"
        );
    }
    assert_eq!(count(&stats.staged_not_ipc), 2);
}

#[test]
fn a_buffer_whose_sharing_the_driver_cannot_say_is_staged() {
    let Some(mpi) = mpi() else { return };
    let (gpu, pool, stats) = (FakeGpu::default(), PinnedPool::default(), Stats::default());
    gpu.fail_ipc_query.store(true, Ordering::SeqCst);
    let direct = Direct::new(mpi, &gpu, &pool, &stats, Placement::IpcShareable);
    let send = floats([1.0, 2.0]);
    let mut recv = vec![0u8; send.len()];
    direct
        .allgather(mpi.world(), input(&send), output(&mut recv))
        .unwrap();
    assert_eq!(recv, send);
    let staged = (count(&stats.staged_not_ipc), count(&stats.staged));
    assert_eq!((staged, count(&stats.direct)), ((1, 1), 0));
}

#[test]
fn a_stream_that_cannot_be_waited_for_runs_the_op_staged_and_says_so() {
    let Some(mpi) = mpi() else { return };
    let (gpu, pool, stats) = (FakeGpu::default(), PinnedPool::default(), Stats::default());
    gpu.fail_synchronize.store(true, Ordering::SeqCst);
    let direct = Direct::new(mpi, &gpu, &pool, &stats, Placement::Any);
    let err = failed_sum(&direct, mpi.world(), (0..5).map(|i| i as f32));
    assert!(err.contains("CUDA_ERROR_LAUNCH_FAILED"), "{err}");
    assert!(err.contains("still made the op's MPI calls"), "{err}");
    // Staged: its chunk's MPI call made, none direct.
    let made = (count(&stats.staged), count(&stats.staged_chunks));
    assert_eq!((made, count(&stats.direct)), ((1, 1), 0));
}

#[test]
fn an_in_place_sendrecv_is_staged_and_a_two_buffer_one_goes_direct() {
    let Some(mpi) = mpi() else { return };
    let (gpu, pool, stats) = (FakeGpu::default(), PinnedPool::default(), Stats::default());
    let direct = Direct::new(mpi, &gpu, &pool, &stats, Placement::Any);
    let to_self = Envelope {
        comm: mpi.world(),
        dest: Peer::Rank(0),
        sendtag: 5,
        source: Peer::Rank(0),
        recvtag: Some(5),
    };
    let message = floats([1.0, -2.0, 3.0]);
    let mut buf = message.clone();
    let status = direct
        .sendrecv(Input::InPlace, output(&mut buf), to_self)
        .unwrap();
    assert_eq!((buf.as_slice(), status.count), (message.as_slice(), 3));
    // Through jaxmpi's host copy: the buffer went GPU→host, and MPI never saw it.
    assert_eq!(gpu.bytes_to_host(), message.len());
    let counted = |s: &Stats| {
        (
            count(&s.staged_in_place),
            count(&s.staged),
            count(&s.direct),
        )
    };
    assert_eq!(counted(&stats), (1, 1, 0));
    let mut recv = vec![0u8; message.len()];
    direct
        .sendrecv(Input::Data(input(&message)), output(&mut recv), to_self)
        .unwrap();
    assert_eq!(recv, message);
    assert_eq!(counted(&stats), (1, 1, 1));
}
