//! Checked mode (`JAXMPI_CHECK=1`): ranks agree on what they call before MPI sees it.
//!
//! MPI cannot see a type mismatch of equal size (one rank reduces float32, another int32:
//! both get garbage), and ranks calling different collectives hang. In checked mode every
//! collective first exchanges a small record of what each rank is calling (op, dtype,
//! count, root, reduction, counts of the v-ops, communicator size, and the pytree a packed
//! buffer comes from, `xla/frame`'s `Tree`) with one allgather on
//! the same communicator; every rank then sees the same records, so a mismatch fails the
//! call on every rank alike, naming what each rank passed. Point to point, the sender
//! sends a header (dtype, count, pytree) right before each message, with the same tag on the
//! same communicator: MPI does not let messages of one sender and tag overtake each other,
//! so the message after a header is the one it describes, whatever the receive matched
//! (any source, any tag).
//!
//! Off, the cost is one atomic load per call. The records travel in host memory through
//! the library's own (host) backend, also for GPU ops.
//!
//! The two exchanges are `collectives.rs` (a record per rank, compared by all) and
//! `messages.rs` (a header before each point-to-point message); what they share (the
//! switch, how a dtype and a pytree travel and are shown) is here.

use std::sync::atomic::{AtomicU8, Ordering};

use crate::Dtype;

mod collectives;
mod messages;

pub(in crate::xla::handlers) use collectives::collective;
pub(in crate::xla::handlers) use messages::{
    exchange_headers, receive_header, send_header, Message,
};

const UNSET: u8 = 0;
const OFF: u8 = 1;
const ON: u8 = 2;
static MODE: AtomicU8 = AtomicU8::new(UNSET);

/// Whether checked mode is on: `JAXMPI_CHECK=1` at start, or as set since.
pub fn enabled() -> bool {
    match MODE.load(Ordering::Relaxed) {
        ON => true,
        OFF => false,
        _ => {
            let on = std::env::var("JAXMPI_CHECK").is_ok_and(|v| v.trim() == "1");
            MODE.store(if on { ON } else { OFF }, Ordering::Relaxed);
            on
        }
    }
}

/// Turns checked mode on or off for every later call (all ranks must do it alike).
pub fn set_enabled(on: bool) {
    MODE.store(if on { ON } else { OFF }, Ordering::Relaxed);
}

/// The step the errors of checked mode name.
const STEP: &str = "JAXMPI_CHECK";

/// How a pytree's fingerprint is shown: its leaves differ between ranks when these do.
fn tree_name(tree: u64) -> String {
    format!("pytree {tree:016x}")
}

fn dtype_index(dtype: Dtype) -> i32 {
    Dtype::ALL.iter().position(|&d| d == dtype).unwrap_or(0) as i32
}
