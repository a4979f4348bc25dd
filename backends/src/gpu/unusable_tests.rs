//! A rank whose GPU is unusable makes the same MPI calls as one whose GPU works:
//! `Staged` over each, with an inner backend that records the calls it is asked for.

use std::sync::Mutex;

use jaxmpi_core::{
    Backend, Broadcast, Buf, BufMut, Comm, Dtype, Envelope, Error, Input, NativeStatus, Peer,
    Progress, ReduceOp, Request, Result, Status,
};

use super::super::fake::FakeGpu;
use super::super::{GpuMemory, PinnedPool, Staged, Stats};
use super::{without_gpu, Unusable};

/// The calls asked for: (op, elements).
#[derive(Default)]
struct Recording {
    calls: Mutex<Vec<(&'static str, usize)>>,
}

impl Recording {
    fn record(&self, op: &'static str, count: usize) -> Result<()> {
        self.calls.lock().unwrap().push((op, count));
        Ok(())
    }
    fn received(&self, op: &'static str, count: usize) -> Result<Status> {
        self.record(op, count)?;
        Ok(Status {
            source: Peer::Rank(0),
            tag: Some(0),
            error: 0,
            count,
            native: NativeStatus {
                bytes: [0; 32],
                len: 0,
            },
        })
    }
    fn calls(&self) -> Vec<(&'static str, usize)> {
        self.calls.lock().unwrap().clone()
    }
}

impl Backend for Recording {
    fn barrier(&self, _: Comm) -> Result<()> {
        self.record("barrier", 0)
    }
    fn allreduce(&self, _: Comm, _: Input, recv: BufMut, _: ReduceOp) -> Result<()> {
        self.record("allreduce", recv.count())
    }
    fn reduce(&self, _: Comm, _: Input, recv: BufMut, _: ReduceOp, _: i32) -> Result<()> {
        self.record("reduce", recv.count())
    }
    fn scan(&self, _: Comm, _: Input, recv: BufMut, _: ReduceOp) -> Result<()> {
        self.record("scan", recv.count())
    }
    fn exscan(&self, _: Comm, _: Input, recv: BufMut, _: ReduceOp) -> Result<()> {
        self.record("exscan", recv.count())
    }
    fn reduce_scatter(&self, _: Comm, send: Buf, _: BufMut, _: ReduceOp) -> Result<()> {
        self.record("reduce_scatter", send.count())
    }
    fn bcast(&self, _: Comm, buf: Broadcast, _: i32) -> Result<()> {
        self.record("bcast", buf.count())
    }
    fn gather(&self, _: Comm, send: Buf, _: BufMut, _: i32) -> Result<bool> {
        self.record("gather", send.count()).map(|()| false)
    }
    fn allgather(&self, _: Comm, send: Buf, _: BufMut) -> Result<()> {
        self.record("allgather", send.count())
    }
    fn scatter(&self, _: Comm, _: Buf, recv: BufMut, _: i32) -> Result<()> {
        self.record("scatter", recv.count())
    }
    fn alltoall(&self, _: Comm, send: Buf, _: BufMut) -> Result<()> {
        self.record("alltoall", send.count())
    }
    fn gatherv(&self, _: Comm, send: Buf, _: jaxmpi_core::PartitionMut, _: i32) -> Result<bool> {
        self.record("gatherv", send.count()).map(|()| false)
    }
    fn allgatherv(&self, _: Comm, send: Buf, _: jaxmpi_core::PartitionMut) -> Result<()> {
        self.record("allgatherv", send.count())
    }
    fn scatterv(&self, _: Comm, _: jaxmpi_core::Partition, recv: BufMut, _: i32) -> Result<()> {
        self.record("scatterv", recv.count())
    }
    fn alltoallv(
        &self,
        _: Comm,
        send: jaxmpi_core::Partition,
        _: jaxmpi_core::PartitionMut,
    ) -> Result<()> {
        self.record("alltoallv", send.buf.count())
    }
    fn send(&self, _: Comm, buf: Buf, _: Peer, _: i32) -> Result<()> {
        self.record("send", buf.count())
    }
    fn recv(&self, _: Comm, buf: BufMut, _: Peer, _: Option<i32>) -> Result<Status> {
        self.received("recv", buf.count())
    }
    fn sendrecv(&self, _: Input, recvbuf: BufMut, _: Envelope) -> Result<Status> {
        self.received("sendrecv", recvbuf.count())
    }
    unsafe fn isend(&self, _: Comm, _: Buf, _: Peer, _: i32) -> Result<Request> {
        unreachable!("staging starts nothing")
    }
    unsafe fn irecv(&self, _: Comm, _: BufMut, _: Peer, _: Option<i32>) -> Result<Request> {
        unreachable!("staging starts nothing")
    }
    fn test(&self, _: &mut Request) -> Result<Progress> {
        unreachable!("staging starts nothing")
    }
    fn wait(&self, _: &mut Request) -> Result<Progress> {
        unreachable!("staging starts nothing")
    }
    fn abandon(&self, _: Request) -> Result<()> {
        unreachable!("staging starts nothing")
    }
}

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
    let (inner, pool, stats) = (
        Recording::default(),
        PinnedPool::default(),
        Stats::default(),
    );
    let staged = Staged::new(&inner, gpu, &pool, &stats).with_chunk_bytes(CHUNK);
    every_op(&staged, send, recv);
    inner.calls()
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
    let inner = Recording::default();
    let why = unusable().why;
    let (send, mut recv) = (vec![0u8; 8], vec![0u8; 8]);
    let err = without_gpu(&inner, why, &mut |b| {
        // Staging fails each call on this GPU (after making it): the next still runs.
        let x = Buf::from_bytes(&send, Dtype::F64).unwrap();
        let sent = b.send(COMM, x, Peer::Rank(1), 0);
        let y = BufMut::from_bytes(&mut recv, Dtype::F64).unwrap();
        sent.and(b.recv(COMM, y, Peer::Rank(1), Some(0)).map(|_| ()))
    })
    .unwrap_err();
    assert_eq!(inner.calls(), [("send", 1), ("recv", 1)]);
    let text = err.to_string();
    assert!(text.starts_with("cuda: the arrays are on GPU 1"), "{text}");
    assert!(text.contains("still made the op's MPI calls"), "{text}");
}
