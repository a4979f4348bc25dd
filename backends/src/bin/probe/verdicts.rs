//! A rank that cannot start its part of a call (on a GPU: no stream, the wrong GPU, ...)
//! must leave no other rank waiting. Two ways, both over this real library:
//! - start verdicts (`jaxmpi_core::xla::handlers::services::start_verdict`): before a
//!   collective, every rank says whether it can start; all get Ok, or all get an error,
//!   the failing ranks their own and the others one naming the lowest failing world rank;
//! - a rank that takes no verdict still makes the op's MPI calls on host scratch memory
//!   (`gpu::unusable`): its peers complete as with a good rank, and it reports its error.
//!
//! Each part ends with a plain call every rank must meet, so a rank left one call behind
//! shows as a wrong result (or a hang CI's timeout reports), not as a pass.

use jaxmpi_backends::gpu::unusable::without_gpu;
use jaxmpi_core::xla::handlers::services::start_verdict::agree;
use jaxmpi_core::{Backend, Broadcast, Dtype, Error, Input, Peer, ReduceOp, Result};

use crate::array::{Array, Value};
use crate::report::{Group, Probe};

/// What a rank that cannot start says, as a GPU rank would.
fn cannot_start() -> Error {
    Error::invalid_argument(
        "cuda",
        "the arrays are on GPU 1, but this rank uses GPU 0 (injected by the probe)",
    )
}

/// The world rank of each rank of `g`.
fn world_ranks(p: &mut Probe, g: &Group) -> Option<Vec<i32>> {
    let mine = Array::from_fn(Dtype::I32, 1, |_| Value::Int(p.rank.into()));
    let mut all = Array::zeroed(Dtype::I32, g.size as usize);
    let label = format!("world ranks of {}", g.name);
    p.ok(
        &label,
        p.backend.allgather(g.comm, mine.buf(), all.buf_mut()),
    )?;
    let rank = |i| match all.get(i) {
        Value::Int(v) => v as i32,
        _ => unreachable!("int32 elements decode as integers"),
    };
    Some((0..g.size as usize).map(rank).collect())
}

/// Every rank of `g` can start; then the ranks in `failing` (ranks of `g`) cannot.
pub fn agreement(p: &mut Probe, g: &Group) {
    p.start(&format!("start verdicts on {}", g.name));
    let Some(world) = world_ranks(p, g) else {
        return;
    };
    let label = format!("start verdict, every rank can start, on {}", g.name);
    p.ok(&label, agree(p.library, g.comm, None));
    let last = g.size - 1;
    let mut cases = vec![vec![last]];
    if g.size >= 3 {
        cases.push(vec![0, last]);
    }
    for failing in cases {
        let names: Vec<String> = failing.iter().map(|r| r.to_string()).collect();
        let label = format!(
            "start verdict, rank {} of {} cannot start",
            names.join(" and "),
            g.name
        );
        let own = cannot_start();
        let mine = failing.contains(&g.rank).then_some(&own);
        let said = match agree(p.library, g.comm, mine) {
            Ok(()) => {
                p.fail(&label, "an error on every rank", "success");
                continue;
            }
            Err(err) => err.to_string(),
        };
        let lowest = failing.iter().map(|&r| world[r as usize]).min();
        let (what, right) = match mine {
            Some(own) => (
                "its own error, saying the others were told",
                said.contains(&own.message) && said.contains("were told"),
            ),
            None => (
                "an error naming the lowest failing world rank",
                said.contains(&format!("rank {} could not start", lowest.unwrap_or(-1))),
            ),
        };
        p.check(&format!("{label}: {what} (got {said:?})"), true, right);
    }
    let label = format!("start verdict after a refused one, on {}", g.name);
    p.ok(&label, agree(p.library, g.comm, None));
}

/// `op` on host memory where this rank is good, through `without_gpu` where it is the
/// failing one: the failing one must say so, the others succeed.
fn run_as(
    p: &mut Probe,
    label: &str,
    failing: bool,
    op: &mut dyn FnMut(&dyn Backend) -> Result<()>,
) {
    if !failing {
        let result = op(p.backend);
        p.ok(label, result);
        return;
    }
    match without_gpu(p.library, cannot_start(), op) {
        Ok(()) => p.fail(label, "this rank's own error", "success"),
        Err(err) => {
            let said = err.to_string();
            let right = said.contains("injected by the probe")
                && said.contains("still made the op's MPI calls");
            p.check(&format!("{label}: the error (got {said:?})"), true, right);
        }
    }
}

/// (1 << 20) + 5 float32: two staging chunks, the second short.
const CHUNKED: usize = (1 << 20) + 5;

/// The last rank's GPU is unusable, and it takes no verdict: it still makes the MPI
/// calls of a send, a receive and two collectives that cut the buffer into chunks.
pub fn unusable_gpu(p: &mut Probe, g: &Group) {
    p.start(&format!("unusable GPU on {}", g.name));
    let failing_rank = g.size - 1;
    let failing = g.rank == failing_rank;
    let n = 7;
    if g.size >= 2 {
        // The failing rank sends to rank 0, which receives it as from any good rank.
        let label = format!("send from an unusable GPU to a plain recv, on {}", g.name);
        let mut buf = Array::zeroed(Dtype::F32, n);
        if failing {
            run_as(p, &label, true, &mut |b| {
                b.send(g.comm, buf.buf(), Peer::Rank(0), 41)
            });
        } else if g.rank == 0 {
            let status = p.backend.recv(g.comm, buf.buf_mut(), Peer::Any, Some(41));
            if let Some(status) = p.ok(&label, status) {
                let from = (status.source, status.count);
                p.check(&label, (Peer::Rank(failing_rank), n), from);
            }
        }
        // And back: rank 0 sends to the failing rank, which receives it into scratch.
        let label = format!("recv on an unusable GPU from a plain send, on {}", g.name);
        let data = Array::from_fn(Dtype::F32, n, |i| Value::Float(i as f64));
        if failing {
            run_as(p, &label, true, &mut |b| {
                b.recv(g.comm, buf.buf_mut(), Peer::Rank(0), Some(42))
                    .map(|_| ())
            });
        } else if g.rank == 0 {
            let sent = p
                .backend
                .send(g.comm, data.buf(), Peer::Rank(failing_rank), 42);
            p.ok(&label, sent);
        }
    }
    let ones = Array::from_fn(Dtype::F32, CHUNKED, |_| Value::Float(1.0));
    let mut sum = Array::zeroed(Dtype::F32, CHUNKED);
    let label = format!(
        "allreduce with an unusable GPU at the last rank, on {}",
        g.name
    );
    run_as(p, &label, failing, &mut |b| {
        b.allreduce(
            g.comm,
            Input::Data(ones.buf()),
            sum.buf_mut(),
            ReduceOp::Sum,
        )
    });
    let mut data = Array::from_fn(Dtype::F32, CHUNKED, |i| Value::Float(i as f64));
    let label = format!("bcast from an unusable GPU at the last rank, on {}", g.name);
    run_as(p, &label, failing, &mut |b| {
        let side = if failing {
            Broadcast::Root(data.buf())
        } else {
            Broadcast::Receiver(data.buf_mut())
        };
        b.bcast(g.comm, side, failing_rank)
    });
    // Every rank must be at the same call now: a plain sum gives every rank the size.
    let one = Array::from_fn(Dtype::I32, 1, |_| Value::Int(1));
    let mut total = Array::zeroed(Dtype::I32, 1);
    let label = format!("allreduce after an unusable GPU's calls, on {}", g.name);
    let result = p.backend.allreduce(
        g.comm,
        Input::Data(one.buf()),
        total.buf_mut(),
        ReduceOp::Sum,
    );
    let expected = Array::from_fn(Dtype::I32, 1, |_| Value::Int(g.size.into()));
    p.result(&label, result, &expected, &total);
}
