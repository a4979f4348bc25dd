//! Start verdicts: before a collective's first MPI call, its ranks agree that every one of
//! them can start its part.
//!
//! Why: on a GPU, a rank prepares its part before MPI sees it (XLA's stream, that stream's
//! context, the rank's GPU, the stream synchronize of CUDA-aware mode), and that can fail
//! on one rank alone. A rank returning its error there would leave the others waiting in a
//! collective it never joins. With start verdicts on, every rank of the call first makes
//! one MPI_Allreduce(MIN) of one int on the call's communicator: `i32::MAX` where it can
//! start, its rank in MPI_COMM_WORLD where it cannot. Every rank so learns the lowest
//! failing rank, every rank returns an error, and nobody makes the op's MPI call. One int
//! and MIN, not an allgather: what each rank moves does not grow with the ranks.
//!
//! A job-wide switch, off by default: it adds a message to every collective, so a rank
//! without it would skip the exchange the others wait in. Python turns it on at import,
//! on every rank alike, in jobs where a rank can run ops on GPUs. CPU calls take part with
//! the verdict "can start" (CPU and GPU ranks may share a call): in `lifecycle.rs`, after
//! checked mode's exchange; GPU calls in the GPU runtime, after their preparation
//! (`crate::gpu`). Off, a call pays one relaxed atomic load.
//!
//! Taken by no other call: started collectives (refused on GPU arrays at trace time, and
//! every rank of a started call starts it alike), MeshComm calls (CPU only), and point to
//! point, where a message of the verdict's own would break pairs whose other side is a
//! started isend/irecv on CPU arrays; there a rank that cannot start still makes the op's
//! MPI calls, on host scratch memory (`crate::gpu`).

use std::sync::atomic::{AtomicBool, Ordering};

use crate::xla::frame::Call;
use crate::xla::handlers::signature::Signature;
use crate::{Buf, BufMut, Comm, Dtype, Error, Input, Library, ReduceOp, Result};

static ON: AtomicBool = AtomicBool::new(false);

/// Whether start verdicts are on.
#[inline]
pub fn enabled() -> bool {
    ON.load(Ordering::Relaxed)
}

/// Turns start verdicts on or off for every later call (all ranks must do it alike,
/// before their first collective).
pub fn set_enabled(on: bool) {
    ON.store(on, Ordering::Relaxed);
}

/// The step the verdict's errors name.
const STEP: &str = "start verdict";

/// What a rank that can start its part contributes.
const CAN_START: i32 = i32::MAX;
/// What a rank that cannot contributes when its world rank cannot be had either.
const UNKNOWN_RANK: i32 = i32::MAX - 1;

/// Whether `call` takes a verdict (on its MPI communicator): a blocking collective, with
/// start verdicts on.
#[inline]
pub(super) fn taken(call: &Call) -> bool {
    enabled()
        && !call.is_start()
        && Signature::named(call.name()).is_some_and(|(s, _)| s.is_collective())
}

/// This rank's contribution: `cannot` is its world rank where it cannot start.
fn encode(cannot: Option<i32>) -> i32 {
    cannot.map_or(CAN_START, |rank| rank.clamp(0, UNKNOWN_RANK))
}

/// The call's verdict from the ranks' minimum: None where every rank can start, else the
/// lowest failing world rank (None inside where it is unknown).
fn decode(min: i32) -> Option<Option<i32>> {
    match min {
        CAN_START => None,
        UNKNOWN_RANK => Some(None),
        rank => Some(Some(rank)),
    }
}

/// What a rank that could start returns when `failed` (a world rank) could not.
fn refused(failed: Option<i32>) -> Error {
    let who = failed.map_or("a rank".to_string(), |rank| format!("rank {rank}"));
    Error::library(
        STEP,
        format!(
            "{who} could not start its part of this call on its GPU (its own error says \
             why); no rank of the call made the MPI call"
        ),
    )
}

/// Tells the other ranks of the call on `comm` whether this one can start (`mine`: why it
/// cannot), and learns whether they all can. Ok only when every rank can; else every rank
/// returns an error: the failing ones their own, the others one naming the lowest failing
/// world rank. Every rank of the call must call it once, before the op's first MPI call.
pub fn agree(library: &dyn Library, comm: Comm, mine: Option<&Error>) -> Result<()> {
    let world_rank = || library.comm_rank(library.world()).unwrap_or(UNKNOWN_RANK);
    let send = encode(mine.map(|_| world_rank())).to_ne_bytes();
    let mut min = [0u8; 4];
    let exchanged = library.backend().allreduce(
        comm,
        Input::Data(Buf::from_bytes(&send, Dtype::I32)?),
        BufMut::from_bytes(&mut min, Dtype::I32)?,
        ReduceOp::Min,
    );
    match (mine, exchanged) {
        (Some(own), Ok(())) => {
            let mut own = own.clone();
            own.message.push_str(
                "; the other ranks of this call were told, and no rank made the MPI call",
            );
            Err(own)
        }
        (Some(own), Err(why)) => {
            let mut own = own.clone();
            own.message.push_str(&format!(
                "; telling the other ranks of this call failed too ({why})"
            ));
            Err(own)
        }
        (None, Err(why)) => {
            Err(why.context("the ranks could not agree that each can start its part"))
        }
        (None, Ok(())) => match decode(i32::from_ne_bytes(min)) {
            None => Ok(()),
            Some(failed) => Err(refused(failed)),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lowest_failing_rank_wins_and_can_start_is_the_largest_value() {
        let ranks = [None, Some(3), None, Some(1)];
        let min = ranks.iter().map(|&r| encode(r)).min().unwrap();
        assert_eq!(decode(min), Some(Some(1)));
        let all = [None, None].iter().map(|&r| encode(r)).min().unwrap();
        assert_eq!(decode(all), None);
        // Rank 0 and the largest ranks MPI can have are told apart from "can start".
        assert_eq!(decode(encode(Some(0))), Some(Some(0)));
        assert_eq!(decode(encode(Some(i32::MAX - 2))), Some(Some(i32::MAX - 2)));
        assert_eq!(decode(encode(Some(i32::MAX))), Some(None));
        assert_eq!(decode(encode(Some(-5))), Some(Some(0)));
    }

    #[test]
    fn the_ranks_that_could_start_are_told_who_could_not() {
        let err = refused(Some(7)).in_op("allreduce").to_string();
        assert_eq!(
            err,
            "allreduce (start verdict): rank 7 could not start its part of this call on its \
             GPU (its own error says why); no rank of the call made the MPI call"
        );
        assert!(refused(None).message.starts_with("a rank could not start"));
    }
}
