//! A rank whose GPU is unusable makes the same MPI calls as one whose GPU works:
//! `Staged` over each, with an inner backend that records the calls it is asked for.

use jaxmpi_core::{
    Backend, Broadcast, Buf, BufMut, Comm, Dtype, Envelope, Error, Input, Peer, ReduceOp,
};

use super::super::fake::FakeGpu;
use super::super::test_ranks::{Ranked, Recording};
use super::super::{GpuMemory, PinnedPool, Staged, Stats};
use super::{without_gpu, Unusable};

const COMM: Comm = Comm(0);

/// One call of every blocking op but the v-ops (which stage like gather), on `send`'s and
/// `recv`'s "GPU" memory; their outcomes are not the point here.
fn every_op(b: &dyn Backend, send: &[u8], recv: &mut [u8]) {
    let dtype = Dtype::F32;
    let x = || Buf::from_bytes(send, dtype).unwrap();
    let sum = ReduceOp::Sum;
    let _ = b.barrier(COMM);
    let y = BufMut::from_bytes(recv, dtype).unwrap();
    let _ = b.allreduce(COMM, Input::Data(x()), y, sum);
    let _ = b.allreduce(
        COMM,
        Input::InPlace,
        BufMut::from_bytes(recv, dtype).unwrap(),
        sum,
    );
    let _ = b.bcast(COMM, Broadcast::Root(x()), 0);
    let _ = b.bcast(
        COMM,
        Broadcast::Receiver(BufMut::from_bytes(recv, dtype).unwrap()),
        0,
    );
    let y = BufMut::from_bytes(recv, dtype).unwrap();
    let _ = b.reduce(COMM, Input::Data(x()), y, sum, 0);
    let _ = b.scan(
        COMM,
        Input::Data(x()),
        BufMut::from_bytes(recv, dtype).unwrap(),
        sum,
    );
    let _ = b.exscan(
        COMM,
        Input::InPlace,
        BufMut::from_bytes(recv, dtype).unwrap(),
        sum,
    );
    let _ = b.reduce_scatter(COMM, x(), BufMut::from_bytes(recv, dtype).unwrap(), sum);
    let _ = b.gather(COMM, x(), BufMut::from_bytes(recv, dtype).unwrap(), 0);
    let _ = b.allgather(COMM, x(), BufMut::from_bytes(recv, dtype).unwrap());
    let _ = b.scatter(COMM, x(), BufMut::from_bytes(recv, dtype).unwrap(), 0);
    let _ = b.alltoall(COMM, x(), BufMut::from_bytes(recv, dtype).unwrap());
    let _ = b.send(COMM, x(), Peer::Rank(1), 3);
    let _ = b.recv(
        COMM,
        BufMut::from_bytes(recv, dtype).unwrap(),
        Peer::Any,
        None,
    );
    let envelope = Envelope {
        comm: COMM,
        dest: Peer::Rank(1),
        sendtag: 3,
        source: Peer::Rank(1),
        recvtag: Some(3),
    };
    let y = BufMut::from_bytes(recv, dtype).unwrap();
    let _ = b.sendrecv(Input::Data(x()), y, envelope);
    let _ = b.sendrecv(
        Input::InPlace,
        BufMut::from_bytes(recv, dtype).unwrap(),
        envelope,
    );
}

/// 10 float32 in chunks of 3: allreduce and bcast make 4 calls each.
const CHUNK: usize = 12;

fn calls_over(gpu: &dyn GpuMemory, send: &[u8], recv: &mut [u8]) -> Vec<(&'static str, usize)> {
    let (pool, stats) = (PinnedPool::default(), Stats::default());
    let library = root_alone(); // every rooted op's root
    let staged = Staged::new(&library, gpu, &pool, &stats).with_chunk_bytes(CHUNK);
    every_op(&staged, send, recv);
    library.backend.calls()
}

fn root_alone() -> Ranked<Recording> {
    Ranked {
        rank: 0,
        size: 1,
        backend: Recording::default(),
    }
}

fn unusable() -> Unusable {
    Unusable::new(Error::invalid_argument(
        "cuda",
        "the arrays are on GPU 1, but this rank uses GPU 0",
    ))
}

#[test]
fn an_unusable_gpu_makes_the_same_mpi_calls_and_never_touches_gpu_memory() {
    let send = vec![1u8; 40];
    let mut recv = vec![7u8; 40];
    let good = calls_over(&FakeGpu::default(), &send, &mut recv);
    assert_eq!(good.iter().filter(|(op, _)| *op == "allreduce").count(), 8);
    let mut untouched = vec![7u8; 40];
    let failed = calls_over(&unusable(), &send, &mut untouched);
    assert_eq!(failed, good);
    assert_eq!(untouched, vec![7u8; 40], "the GPU's memory was written");
}

#[test]
fn the_rank_returns_its_own_error_saying_the_calls_were_made() {
    let library = root_alone();
    let why = unusable().why;
    let (send, mut recv) = (vec![0u8; 8], vec![0u8; 8]);
    let err = without_gpu(&library, why, &mut |b| {
        // Staging fails each call on this GPU (after making it): the next still runs.
        let x = Buf::from_bytes(&send, Dtype::F64).unwrap();
        let sent = b.send(COMM, x, Peer::Rank(1), 0);
        let y = BufMut::from_bytes(&mut recv, Dtype::F64).unwrap();
        sent.and(b.recv(COMM, y, Peer::Rank(1), Some(0)).map(|_| ()))
    })
    .unwrap_err();
    assert_eq!(library.backend.calls(), [("send", 1), ("recv", 1)]);
    let text = err.to_string();
    assert!(text.starts_with("cuda: the arrays are on GPU 1"), "{text}");
    assert!(text.contains("still made the op's MPI calls"), "{text}");
}
