//! Ranks whose buffers live in different memories, in one job: rank 0 stages through a
//! fake GPU's host copies (the pipeline of a GPU rank over a non-CUDA-aware MPI), rank 1
//! passes host memory as a CPU rank does, rank 2 goes the CUDA-aware way (GPU pointers,
//! which the fake GPU's are). allreduce and bcast spanning several staging chunks must
//! give every rank the right data: a rank making one MPI call where another makes one per
//! chunk would pair calls of different sizes. Then rank 0's GPU fails mid-pipeline: it
//! must report it, and every rank's next call must still meet the others'.

use std::sync::atomic::Ordering;

use jaxmpi_backends::chunks::{chunks, CHUNK_BYTES};
use jaxmpi_backends::gpu::fake::FakeGpu;
use jaxmpi_backends::gpu::{Direct, PinnedPool, Placement, Staged, Stats};
use jaxmpi_core::{Backend, Broadcast, Dtype, Input, ReduceOp};

use crate::array::Array;
use crate::data::{Data, Pattern};
use crate::report::{Group, Probe};

/// (3 << 20) + 5 float32: three whole chunks and a tail.
const TAILED: usize = (3 << 20) + 5;

fn kind(rank: i32) -> &'static str {
    ["staged", "host", "direct"][(rank % 3) as usize]
}

pub fn run(p: &mut Probe, g: &Group) {
    let (gpu, pool, stats) = (FakeGpu::default(), PinnedPool::default(), Stats::default());
    let host = p.library.backend();
    let staged = Staged::new(p.library, &gpu, &pool, &stats);
    let direct = Direct::new(p.library, &gpu, &pool, &stats, Placement::Any);
    let mine: &dyn Backend = match kind(g.rank) {
        "staged" => &staged,
        "direct" => &direct,
        _ => host,
    };
    let mut expected_chunks = 0;
    let bf16s = CHUNK_BYTES / 2 + 3;
    for (dtype, n, op) in [
        (Dtype::F32, 0, ReduceOp::Sum),
        (Dtype::F32, 7, ReduceOp::Sum),
        (Dtype::F32, TAILED, ReduceOp::Sum),
        (Dtype::BF16, bf16s, ReduceOp::Sum),
        (Dtype::I64, CHUNK_BYTES / 8 * 2 + 1, ReduceOp::Max),
    ] {
        for in_place in [false, true] {
            allreduce(p, g, mine, (dtype, n, op), in_place);
            expected_chunks += chunks(n, dtype.size()).len();
        }
    }
    for (dtype, n, root) in [
        (Dtype::F32, TAILED, g.size - 1),
        (Dtype::C64, CHUNK_BYTES / 8 + 9, 0),
        (Dtype::Bool, 7, g.size / 2),
    ] {
        bcast(p, g, mine, dtype, n, root);
        expected_chunks += chunks(n, dtype.size()).len();
    }
    let label = format!("{} memory: MPI calls staged per chunk", kind(g.rank));
    match kind(g.rank) {
        "staged" => {
            let made = stats.staged_chunks.load(Ordering::Relaxed) as usize;
            p.check(&label, expected_chunks, made);
        }
        "direct" => {
            // bfloat16 sums run jaxmpi's own reduction on the host: staged, in chunks.
            let made = stats.staged_host_code.load(Ordering::Relaxed);
            p.check(&format!("{label} (host code)"), 2, made);
        }
        _ => {}
    }
    for root in g.roots() {
        scatter(p, g, mine, &gpu, root);
    }
    failing_gpu(p, g, mine, &gpu);
}

fn allreduce(
    p: &mut Probe,
    g: &Group,
    b: &dyn Backend,
    (dtype, n, op): (Dtype, usize, ReduceOp),
    in_place: bool,
) {
    let how = if in_place { " in place" } else { "" };
    let label = format!(
        "allreduce {op} {dtype} n={n}{how}, {} memory, on {}",
        kind(g.rank),
        g.name
    );
    p.start(&label);
    // Seeded alike on every rank, whatever its memory.
    let seed = format!("allreduce {op} {dtype} n={n}{how} in mixed memories");
    let data = Data::new(&seed, dtype, Pattern::for_op(op), g.size);
    let send = data.of_rank(g.rank, n);
    let expected = Array::from_fn(dtype, n, |i| data.reduced(op, 0..g.size, i));
    let (result, got) = if in_place {
        let mut recv = send.clone();
        (
            b.allreduce(g.comm, Input::InPlace, recv.buf_mut(), op),
            recv,
        )
    } else {
        let mut recv = Array::zeroed(dtype, n);
        let result = b.allreduce(g.comm, Input::Data(send.buf()), recv.buf_mut(), op);
        (result, recv)
    };
    p.result(&label, result, &expected, &got);
}

fn bcast(p: &mut Probe, g: &Group, b: &dyn Backend, dtype: Dtype, n: usize, root: i32) {
    let label = format!(
        "bcast {dtype} n={n} root={root}, {} memory, on {}",
        kind(g.rank),
        g.name
    );
    p.start(&label);
    let seed = format!("bcast {dtype} n={n} root={root} in mixed memories");
    let data = Data::new(&seed, dtype, Pattern::Wide, g.size);
    let mut buf = data.of_rank(g.rank, n);
    let expected = data.of_rank(root, n);
    let side = if g.rank == root {
        Broadcast::Root(buf.buf())
    } else {
        Broadcast::Receiver(buf.buf_mut())
    };
    let result = b.bcast(g.comm, side, root);
    p.result(&label, result, &expected, &buf);
}

/// The root's table passed on every rank, as inside shard_map: every rank gets its block,
/// and the staged rank copies the table GPU→host only where it is the root (MPI reads it
/// nowhere else).
fn scatter(p: &mut Probe, g: &Group, b: &dyn Backend, gpu: &FakeGpu, root: i32) {
    let (dtype, n) = (Dtype::F32, 5);
    let label = format!(
        "scatter {dtype} n={n} root={root}, the table on every rank, {} memory, on {}",
        kind(g.rank),
        g.name
    );
    p.start(&label);
    let seed = format!("scatter {dtype} n={n} root={root} in mixed memories");
    let data = Data::new(&seed, dtype, Pattern::Wide, g.size);
    let table = data.of_rank(root, n * g.size as usize);
    let mut recv = Array::zeroed(dtype, n);
    let offset = n * g.rank as usize;
    let expected = Array::from_fn(dtype, n, |i| data.value(root, offset + i));
    let before = gpu.bytes_to_host();
    let result = b.scatter(g.comm, table.buf(), recv.buf_mut(), root);
    p.result(&label, result, &expected, &recv);
    if kind(g.rank) == "staged" {
        let staged = if g.rank == root {
            table.bytes().len()
        } else {
            0
        };
        let copied = gpu.bytes_to_host() - before;
        p.check(&format!("{label}: bytes copied GPU→host"), staged, copied);
    }
}

/// Rank 0's GPU fails after its first chunk's copy: rank 0 reports it, the others
/// finish, and a good call after it gives everyone the right sum.
fn failing_gpu(p: &mut Probe, g: &Group, b: &dyn Backend, gpu: &FakeGpu) {
    let failing = g.rank == 0;
    if failing {
        let next = gpu.copies_queued() + 1;
        gpu.copies_before_failing.store(next, Ordering::SeqCst);
    }
    let label = format!("allreduce on a failing GPU at rank 0, on {}", g.name);
    p.start(&label);
    let send = Array::from_fn(Dtype::F32, TAILED, |_| crate::array::Value::Float(1.0));
    let mut recv = Array::zeroed(Dtype::F32, TAILED);
    let result = b.allreduce(
        g.comm,
        Input::Data(send.buf()),
        recv.buf_mut(),
        ReduceOp::Sum,
    );
    if failing {
        gpu.copies_before_failing
            .store(usize::MAX, Ordering::SeqCst);
        match result {
            Err(err) => {
                let said = err.to_string();
                p.check(
                    &format!("{label}: the error says the calls were made"),
                    true,
                    said.contains("still made the op's MPI calls"),
                );
            }
            Ok(()) => p.fail(&label, "the injected failure", "success"),
        }
    } else {
        p.ok(&label, result);
    }
    allreduce(p, g, b, (Dtype::F32, 7, ReduceOp::Sum), false);
}
