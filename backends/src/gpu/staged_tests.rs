//! Staging logic on a fake GPU (host memory whose async copies only happen at a
//! wait/synchronize), with a real MPI library at 1 rank underneath (`test_mpi.rs`), or, for
//! what differs between ranks, a library that says which rank it is (`test_ranks.rs`).

use jaxmpi_core::{Backend, Broadcast, Envelope, Input, Library, Partition, Peer, ReduceOp};

use super::super::fake::{FakeGpu, GARBAGE};
use super::super::test_mpi::{count, failed_sum, floats, input, mpi, output};
use super::super::test_ranks::{Ranked, Recording};
use super::super::{PinnedPool, Stats};
use super::Staged;

#[test]
fn the_fake_gpu_defers_copies_until_synchronized() {
    use super::super::GpuMemory;
    let gpu = FakeGpu::default();
    let (src, mut dst) = ([1u8; 4], [0u8; 4]);
    gpu.copy_to_host_async(dst.as_mut_ptr(), src.as_ptr(), 4)
        .unwrap();
    assert_eq!(dst, [0; 4]);
    gpu.synchronize().unwrap();
    assert_eq!(dst, [1; 4]);
}

#[test]
fn pipelined_allreduce_returns_every_chunk_and_reuses_its_pinned_buffers() {
    let Some(mpi) = mpi() else { return };
    let (gpu, pool, stats) = (FakeGpu::default(), PinnedPool::default(), Stats::default());
    // 3 floats per chunk: 10 elements make 3 full chunks and a short one.
    let staged = Staged::new(mpi, &gpu, &pool, &stats).with_chunk_bytes(12);
    let send = floats((0..10).map(|i| i as f32));
    for round in 0..3 {
        let mut recv = vec![0u8; send.len()];
        staged
            .allreduce(
                mpi.world(),
                Input::Data(input(&send)),
                output(&mut recv),
                ReduceOp::Sum,
            )
            .unwrap();
        assert_eq!(recv, send, "round {round}");
        assert_eq!(gpu.pending(), 0, "work left on the stream after the call");
    }
    assert_eq!(*gpu.pinned_allocations.lock().unwrap(), 2);
    assert!(pool.held_bytes() >= 2 * send.len());
    pool.release();
    assert_eq!(pool.held_bytes(), 0);
}

#[test]
fn in_place_allreduce_reads_and_writes_the_result_buffer() {
    let Some(mpi) = mpi() else { return };
    let (gpu, pool, stats) = (FakeGpu::default(), PinnedPool::default(), Stats::default());
    let staged = Staged::new(mpi, &gpu, &pool, &stats).with_chunk_bytes(8);
    let expected = floats([1.5, -2.0, 3.0, 4.0, 5.0]);
    let mut data = expected.clone();
    staged
        .allreduce(
            mpi.world(),
            Input::InPlace,
            output(&mut data),
            ReduceOp::Max,
        )
        .unwrap();
    assert_eq!(data, expected);
}

#[test]
fn a_growing_message_gets_a_larger_buffer_and_a_smaller_one_reuses_it() {
    let Some(mpi) = mpi() else { return };
    let (gpu, pool, stats) = (FakeGpu::default(), PinnedPool::default(), Stats::default());
    let staged = Staged::new(mpi, &gpu, &pool, &stats);
    for n in [4usize, 64, 16] {
        let send = floats((0..n).map(|i| i as f32 * 0.5));
        let mut recv = vec![0u8; send.len()];
        let to_self = Envelope {
            comm: mpi.world(),
            dest: Peer::Rank(0),
            sendtag: 7,
            source: Peer::Rank(0),
            recvtag: Some(7),
        };
        let (send_buf, recv_buf) = (Input::Data(input(&send)), output(&mut recv));
        staged.sendrecv(send_buf, recv_buf, to_self).unwrap();
        assert_eq!(recv, send, "{n} elements");
    }
    // 4 → 2 buffers, 64 → 2 larger ones; 16 fits in those.
    assert_eq!(*gpu.pinned_allocations.lock().unwrap(), 4);
}

#[test]
fn in_place_sendrecv_stages_the_buffer_in_and_the_message_out() {
    let Some(mpi) = mpi() else { return };
    let (gpu, pool, stats) = (FakeGpu::default(), PinnedPool::default(), Stats::default());
    let staged = Staged::new(mpi, &gpu, &pool, &stats);
    let expected = floats([3.0, -1.0, 0.5]);
    let mut data = expected.clone();
    let world = mpi.world();
    let to_self = Envelope {
        comm: world,
        dest: Peer::Rank(0),
        sendtag: 3,
        source: Peer::Rank(0),
        recvtag: Some(3),
    };
    let status = staged
        .sendrecv(Input::InPlace, output(&mut data), to_self)
        .unwrap();
    assert_eq!((data, gpu.pending(), status.count), (expected, 0, 3));
    // From PROC_NULL nothing arrives: the buffer comes back as it went in.
    let mut kept = floats([7.0, 8.0]);
    let nowhere = Envelope {
        comm: world,
        dest: Peer::Null,
        sendtag: 0,
        source: Peer::Null,
        recvtag: None,
    };
    staged
        .sendrecv(Input::InPlace, output(&mut kept), nowhere)
        .unwrap();
    assert_eq!(kept, floats([7.0, 8.0]));
}

#[test]
fn bcast_at_the_root_leaves_the_data_and_finishes_its_copies() {
    let Some(mpi) = mpi() else { return };
    let (gpu, pool, stats) = (FakeGpu::default(), PinnedPool::default(), Stats::default());
    let staged = Staged::new(mpi, &gpu, &pool, &stats).with_chunk_bytes(4);
    let expected = floats([9.0, 8.0, 7.0]);
    let data = expected.clone();
    let root = Broadcast::Root(input(&data));
    staged.bcast(mpi.world(), root, 0).unwrap();
    assert_eq!((data, gpu.pending()), (expected, 0));
}

#[test]
fn in_place_bcast_stages_both_ways_and_keeps_the_roots_message() {
    let Some(mpi) = mpi() else { return };
    let (gpu, pool, stats) = (FakeGpu::default(), PinnedPool::default(), Stats::default());
    let staged = Staged::new(mpi, &gpu, &pool, &stats).with_chunk_bytes(4);
    let expected = floats([9.0, 8.0, 7.0]);
    let mut data = expected.clone();
    let buf = Broadcast::InPlace(output(&mut data));
    staged.bcast(mpi.world(), buf, 0).unwrap();
    assert_eq!((data, gpu.pending()), (expected, 0));
    assert_eq!(count(&stats.staged_chunks), 3);
}

#[test]
fn whole_staged_collectives_copy_results_back_to_the_gpu() {
    let Some(mpi) = mpi() else { return };
    let (gpu, pool, stats) = (FakeGpu::default(), PinnedPool::default(), Stats::default());
    let staged = Staged::new(mpi, &gpu, &pool, &stats);
    let world = mpi.world();
    let send = floats([1.0, 2.0]);
    let mut recv = vec![0u8; send.len()];
    staged
        .gather(world, input(&send), output(&mut recv), 0)
        .unwrap();
    assert_eq!(recv, send);
    let mut recv = vec![0u8; send.len()];
    staged
        .alltoall(world, input(&send), output(&mut recv))
        .unwrap();
    assert_eq!(recv, send);
    let mut recv = vec![0u8; send.len()];
    staged
        .reduce(
            world,
            Input::Data(input(&send)),
            output(&mut recv),
            ReduceOp::Sum,
            0,
        )
        .unwrap();
    assert_eq!(recv, send);
    assert_eq!(gpu.pending(), 0);
}

#[test]
fn exscan_leaves_rank_0s_result_as_it_was() {
    let Some(mpi) = mpi() else { return };
    let (gpu, pool, stats) = (FakeGpu::default(), PinnedPool::default(), Stats::default());
    let staged = Staged::new(mpi, &gpu, &pool, &stats);
    let send = floats([1.0, 2.0]);
    let before = floats([5.0, 6.0]);
    let mut recv = before.clone();
    staged
        .exscan(
            mpi.world(),
            Input::Data(input(&send)),
            output(&mut recv),
            ReduceOp::Sum,
        )
        .unwrap();
    assert_eq!(recv, before);
    assert!(!recv.contains(&GARBAGE));
}

#[test]
fn zeroing_the_op_bodies_ask_for_runs_on_the_stream() {
    let Some(mpi) = mpi() else { return };
    let (gpu, pool, stats) = (FakeGpu::default(), PinnedPool::default(), Stats::default());
    let staged = Staged::new(mpi, &gpu, &pool, &stats);
    let mut zeroed = floats([3.0]);
    staged.fill_zeros(output(&mut zeroed)).unwrap();
    // Queued on the stream (XLA's later work is ordered after it), not done by the host.
    assert_eq!(gpu.pending(), 1);
    use super::super::GpuMemory;
    gpu.synchronize().unwrap();
    assert_eq!(zeroed, vec![0u8; 4]);
}

#[test]
fn a_copy_failing_mid_pipeline_still_makes_every_chunk_call_and_says_so() {
    let Some(mpi) = mpi() else { return };
    let (gpu, pool, stats) = (FakeGpu::default(), PinnedPool::default(), Stats::default());
    // 3 floats per chunk, 4 chunks; the third copy in fails.
    let staged = Staged::new(mpi, &gpu, &pool, &stats).with_chunk_bytes(12);
    gpu.copies_before_failing
        .store(2, std::sync::atomic::Ordering::SeqCst);
    let err = failed_sum(&staged, mpi.world(), (0..10).map(|i| i as f32));
    assert!(err.contains("CUDA_ERROR_ILLEGAL_ADDRESS"), "{err}");
    assert!(err.contains("still made the op's MPI calls"), "{err}");
    assert_eq!(
        count(&stats.staged_chunks),
        4,
        "every chunk's MPI call made"
    );
    // The stream could be waited for: its buffers went back to the pool.
    assert_eq!(count(&stats.withheld), 0);
    assert!(pool.held_bytes() >= 2 * 10 * 4); // its 10 floats in and out
}

#[test]
fn buffers_the_stream_may_still_write_are_kept_out_of_the_pool() {
    let Some(mpi) = mpi() else { return };
    let (gpu, pool, stats) = (FakeGpu::default(), PinnedPool::default(), Stats::default());
    let staged = Staged::new(mpi, &gpu, &pool, &stats).with_chunk_bytes(12);
    // Warm the pool, then fail the stream: nothing of that call may come back to it.
    let send = floats((0..10).map(|i| i as f32));
    let mut recv = vec![0u8; send.len()];
    let call = |recv: &mut Vec<u8>| {
        staged.allreduce(
            mpi.world(),
            Input::Data(input(&send)),
            output(recv),
            ReduceOp::Sum,
        )
    };
    call(&mut recv).unwrap();
    let held = pool.held_bytes();
    gpu.fail_synchronize
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let err = call(&mut recv).unwrap_err().to_string();
    assert!(err.contains("CUDA_ERROR_LAUNCH_FAILED"), "{err}");
    assert_eq!(
        count(&stats.withheld),
        2,
        "send and receive copies withheld"
    );
    assert_eq!(
        pool.held_bytes(),
        0,
        "the pool held {held} bytes, now lent out for good"
    );
}

#[test]
fn pinning_that_fails_falls_back_to_pageable_memory_with_the_same_results() {
    let Some(mpi) = mpi() else { return };
    let (gpu, pool, stats) = (FakeGpu::default(), PinnedPool::default(), Stats::default());
    gpu.fail_pinning
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let staged = Staged::new(mpi, &gpu, &pool, &stats);
    let send = floats([4.0, 5.0, 6.0]);
    let mut recv = vec![0u8; send.len()];
    staged
        .allgather(mpi.world(), input(&send), output(&mut recv))
        .unwrap();
    assert_eq!(recv, send);
    assert_eq!(count(&stats.pageable), 2);
    assert_eq!((pool.allocations(), pool.held_bytes()), (0, 0));
}

#[test]
fn pinned_allocations_stay_flat_over_repeated_calls() {
    let Some(mpi) = mpi() else { return };
    let (gpu, pool, stats) = (FakeGpu::default(), PinnedPool::default(), Stats::default());
    let staged = Staged::new(mpi, &gpu, &pool, &stats).with_chunk_bytes(16);
    let send = floats((0..37).map(|i| i as f32));
    let mut recv = vec![0u8; send.len()];
    let mut after_first = 0;
    for round in 0..20 {
        staged
            .allreduce(
                mpi.world(),
                Input::Data(input(&send)),
                output(&mut recv),
                ReduceOp::Max,
            )
            .unwrap();
        staged
            .bcast(mpi.world(), Broadcast::Root(input(&send)), 0)
            .unwrap();
        if round == 0 {
            after_first = pool.allocations();
        }
    }
    assert_eq!(pool.allocations(), after_first);
    assert_eq!(count(&stats.staged), 40);
}

/// Ranks of the scatters below, their root, and the elements each rank receives.
const SIZE: i32 = 3;
const ROOT: i32 = 1;
const BLOCK: usize = 4;

/// A scatter (`v`: a scatterv) at `rank`, the root's table passed on every rank as inside
/// shard_map: the bytes it copied GPU→host, the send elements MPI was given, and the
/// pinned bytes it borrowed.
fn scatter_at(rank: i32, v: bool) -> (usize, Vec<usize>, usize) {
    let (gpu, pool, stats) = (FakeGpu::default(), PinnedPool::default(), Stats::default());
    let library = Ranked {
        rank,
        size: SIZE,
        backend: Recording::default(),
    };
    let staged = Staged::new(&library, &gpu, &pool, &stats);
    let table = floats((0..SIZE as usize * BLOCK).map(|i| i as f32));
    let mut recv = vec![0u8; BLOCK * 4];
    let (counts, displs) = ([BLOCK; SIZE as usize], [0, BLOCK, 2 * BLOCK]);
    let world = library.world();
    if v {
        let send = Partition::new(input(&table), &counts, &displs);
        staged.scatterv(world, send, output(&mut recv), ROOT)
    } else {
        staged.scatter(world, input(&table), output(&mut recv), ROOT)
    }
    .unwrap();
    assert_eq!(gpu.pending(), 0, "work left on the stream after the call");
    (
        gpu.bytes_to_host(),
        library.backend.tables(),
        pool.held_bytes(),
    )
}

#[test]
fn scatter_stages_the_send_table_at_the_root_alone() {
    for v in [false, true] {
        for rank in 0..SIZE {
            let (copied, tables, held) = scatter_at(rank, v);
            let table = if rank == ROOT {
                SIZE as usize * BLOCK
            } else {
                0
            };
            let which = format!(
                "{} at rank {rank} of {SIZE}",
                ["scatter", "scatterv"][v as usize]
            );
            assert_eq!(copied, table * 4, "{which}: bytes copied GPU→host");
            assert_eq!(tables, [table], "{which}: send elements MPI was given");
            assert_eq!(held, (table + BLOCK) * 4, "{which}: pinned bytes borrowed");
        }
    }
}

#[test]
fn scatter_at_the_root_delivers_its_block_over_mpi() {
    let Some(mpi) = mpi() else { return };
    let (gpu, pool, stats) = (FakeGpu::default(), PinnedPool::default(), Stats::default());
    let staged = Staged::new(mpi, &gpu, &pool, &stats);
    let world = mpi.world();
    let send = floats([1.0, 2.0, 3.0]);
    let mut recv = vec![0u8; send.len()];
    staged
        .scatter(world, input(&send), output(&mut recv), 0)
        .unwrap();
    assert_eq!(recv, send);
    let mut recv = vec![0u8; send.len()];
    let (counts, displs) = ([3], [0]);
    let table = Partition::new(input(&send), &counts, &displs);
    staged.scatterv(world, table, output(&mut recv), 0).unwrap();
    assert_eq!((recv, gpu.pending()), (send, 0));
    assert_eq!(gpu.bytes_to_host(), 2 * 3 * 4);
}
