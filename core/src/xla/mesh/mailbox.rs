//! Messages between devices of this process that cross meetings: a send whose receive
//! comes later waits here, copied (what MPI calls buffering); a started receive whose
//! send comes later waits here for it, and the send copies straight into its buffer and
//! then completes the receive's request: a message of no bytes from this process to
//! itself on a communicator of its own, so the request is one MPI's waits can complete
//! like any other.

use std::collections::{HashMap, VecDeque};
use std::sync::{Mutex, MutexGuard, OnceLock};

use super::comm_sets::Made;
use super::group::MAILBOX_TAG;
use super::seat::{deliver, fits, Half};
use crate::{Backend, Buf, BufMut, Comm, Dtype, Error, Library, Peer, Request, Result};

/// (group, from, to, tag).
type Key = (usize, usize, usize, i32);

#[derive(Default)]
struct Boxes {
    letters: HashMap<Key, VecDeque<Vec<u8>>>,
    /// Started receives waiting for their send: (group, the receive, its signal tag).
    awaiting: Vec<(usize, Half, i32)>,
    signals: i32,
}

fn boxes() -> MutexGuard<'static, Boxes> {
    static BOXES: OnceLock<Mutex<Boxes>> = OnceLock::new();
    BOXES
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

/// A communicator of this process alone, for the signals.
fn alone(library: &dyn Library) -> Result<Comm> {
    static ALONE: Made = Made::new();
    ALONE.get(|| {
        let me = library.comm_rank(library.world())?;
        library.comm_create_group(&[me], MAILBOX_TAG)
    })
}

fn matches(receive: &Half, group: usize, key: &Key) -> bool {
    key.0 == group
        && (key.1, key.2) == (receive.from, receive.to)
        && receive.tag.is_none_or(|tag| tag == key.3)
}

/// A send whose receive is not in its meeting: into a started receive waiting for it,
/// else into the mailbox.
pub fn put(group: usize, send: &Half, library: &dyn Library, backend: &dyn Backend) -> Result<()> {
    let key = (group, send.from, send.to, send.tag.unwrap_or(0));
    let mut boxes = boxes();
    if let Some(i) = boxes
        .awaiting
        .iter()
        .position(|(_, r, _)| matches(r, group, &key))
    {
        let (_, receive, signal) = boxes.awaiting.remove(i);
        drop(boxes);
        deliver(send, &receive)?;
        // SAFETY: no bytes are read.
        let nothing = unsafe { Buf::from_raw(std::ptr::null(), 0, Dtype::U8) };
        return backend.send(alone(library)?, nothing, Peer::Rank(0), signal);
    }
    // SAFETY: a live operand of a call of this meeting, `bytes` long.
    let data = unsafe { std::slice::from_raw_parts(send.at as *const u8, send.bytes) };
    boxes
        .letters
        .entry(key)
        .or_default()
        .push_back(data.to_vec());
    Ok(())
}

/// A receive from a send that came before, if one did.
pub fn take(group: usize, receive: &Half) -> Result<bool> {
    let mut boxes = boxes();
    let key = boxes
        .letters
        .iter()
        .filter(|(k, queue)| matches(receive, group, k) && !queue.is_empty())
        .map(|(k, _)| *k)
        .min_by_key(|k| k.3);
    let Some(data) = key.and_then(|k| boxes.letters.get_mut(&k)?.pop_front()) else {
        return Ok(false);
    };
    drop(boxes);
    fits(data.len(), receive)?;
    // SAFETY: a live result of a call of this meeting, at least `data.len()` long.
    unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), receive.at as *mut u8, data.len()) };
    Ok(true)
}

/// A started receive whose send comes later: the request its wait completes.
pub fn await_send(
    group: usize,
    receive: &Half,
    library: &dyn Library,
    backend: &dyn Backend,
) -> Result<Request> {
    let comm = alone(library)?;
    let signal = {
        let mut boxes = boxes();
        boxes.signals = (boxes.signals + 1) % 30_000;
        let signal = boxes.signals;
        boxes.awaiting.push((group, *receive, signal));
        signal
    };
    // SAFETY: a message of no bytes: nothing is ever written.
    let nothing =
        unsafe { BufMut::from_raw(std::ptr::NonNull::<u8>::dangling().as_ptr(), 0, Dtype::U8) };
    // SAFETY: as above.
    let mut request = unsafe { backend.irecv(comm, nothing, Peer::Rank(0), Some(signal)) }?;
    request.receives = None; // its status is no message of the op's
    Ok(request)
}

pub fn nothing_sent(receive: &Half) -> Error {
    Error::invalid_argument(
        "recv",
        format!(
            "rank {} receives from rank {} of the same process{}, which sent it nothing \
             before: on a MeshComm, a blocking receive from a device of the \
             same process comes after the send in program order (or start it: irecv)",
            receive.to,
            receive.from,
            receive
                .tag
                .map(|t| format!(" (tag {t})"))
                .unwrap_or_default(),
        ),
    )
}
