//! Checked mode point to point: the sender sends a header (dtype, count, pytree) right
//! before each message, with the same tag on the same communicator. MPI does not let
//! messages of one sender and tag overtake each other, so the message after a header is
//! the one it describes, whatever the receive matched (any source, any tag); the
//! receiver compares it with what its buffer expects.

use std::fmt;

use super::{dtype_index, tree_name, STEP};
use crate::{Buf, BufMut, Comm, Dtype, Error, Library, Peer, Result, Status};

/// What a point-to-point message is, as its header announces it: dtype, element count and
/// the pytree it packs (`Tree`'s fingerprint, 0 for a single array).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::xla::handlers) struct Message {
    pub dtype: Dtype,
    pub count: usize,
    pub tree: u64,
}

impl fmt::Display for Message {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}[{}]", self.dtype, self.count)?;
        if self.tree != 0 {
            write!(f, " of {}", tree_name(self.tree))?;
        }
        Ok(())
    }
}

/// A point-to-point message's header.
const HEADER_BYTES: usize = 24;
const MAGIC: u32 = 0x4a58_4d43; // "JXMC"

fn header(message: Message) -> [u8; HEADER_BYTES] {
    let mut out = [0u8; HEADER_BYTES];
    out[..4].copy_from_slice(&MAGIC.to_le_bytes());
    out[4..8].copy_from_slice(&(dtype_index(message.dtype) as u32).to_le_bytes());
    out[8..16].copy_from_slice(&(message.count as u64).to_le_bytes());
    out[16..].copy_from_slice(&message.tree.to_le_bytes());
    out
}

/// The message a header announces, or None if it is no header (a sender that is not in
/// checked mode sent data).
fn read_header(bytes: &[u8]) -> Option<Message> {
    let word = |range: std::ops::Range<usize>| bytes.get(range).map(|b| b.to_vec());
    let magic = u32::from_le_bytes(word(0..4)?.try_into().ok()?);
    let dtype = u32::from_le_bytes(word(4..8)?.try_into().ok()?);
    let count = u64::from_le_bytes(word(8..16)?.try_into().ok()?);
    let tree = u64::from_le_bytes(word(16..24)?.try_into().ok()?);
    (magic == MAGIC).then_some(Message {
        dtype: *Dtype::ALL.get(dtype as usize)?,
        count: count as usize,
        tree,
    })
}

/// The header that goes before `message`.
pub(in crate::xla::handlers) fn send_header(
    library: &dyn Library,
    comm: Comm,
    dest: Peer,
    tag: i32,
    message: Message,
) -> Result<()> {
    if dest == Peer::Null {
        return Ok(());
    }
    let bytes = header(message);
    library
        .backend()
        .send(comm, Buf::from_bytes(&bytes, Dtype::U8)?, dest, tag)
}

/// What a receive learned from the header of the message it is about to receive: where
/// the message comes from (to receive exactly that one next) and, if it is not what the
/// receiver expects, the error to raise once the message itself is received.
pub(in crate::xla::handlers) struct Announced {
    pub source: Peer,
    pub tag: Option<i32>,
    pub mismatch: Option<Error>,
}

/// Receives the header of the next message from `source` with `tag` and compares it with
/// what the receive expects (its buffer's dtype and element count, its pytree).
pub(in crate::xla::handlers) fn receive_header(
    library: &dyn Library,
    comm: Comm,
    (source, tag): (Peer, Option<i32>),
    expected: Message,
) -> Result<Announced> {
    if source == Peer::Null {
        return Ok(Announced {
            source,
            tag,
            mismatch: None,
        });
    }
    let mut bytes = [0u8; HEADER_BYTES];
    let status = library.backend().recv(
        comm,
        BufMut::from_bytes(&mut bytes, Dtype::U8)?,
        source,
        tag,
    )?;
    Ok(announced(&status, &bytes, expected))
}

/// `status` and `bytes`: the header just received (by a receive or a sendrecv).
fn announced(status: &Status, bytes: &[u8], expected: Message) -> Announced {
    let from = status.source;
    let mismatch = match read_header(&bytes[..status.count.min(bytes.len())]) {
        Some(sent) if sent == expected => None,
        Some(sent) => Some(Error::invalid_argument(
            STEP,
            format!(
                "rank {from} sent {sent} (tag {}), but this receive expects {expected}: \
                 sender and receiver must agree on dtype and size (and pytree structure)",
                status.tag.unwrap_or(-1),
            ),
        )),
        None => Some(Error::invalid_argument(
            STEP,
            format!(
                "the message from rank {from} has no checked-mode header: every rank must \
                 run with the same JAXMPI_CHECK"
            ),
        )),
    };
    Announced {
        source: from,
        tag: status.tag,
        mismatch,
    }
}

/// For a sendrecv: this rank's header out, the peer's header in, in one exchange.
pub(in crate::xla::handlers) fn exchange_headers(
    library: &dyn Library,
    envelope: crate::Envelope,
    sent: Message,
    expected: Message,
) -> Result<Announced> {
    let out = header(sent);
    let mut bytes = [0u8; HEADER_BYTES];
    let status = library.backend().sendrecv(
        crate::Input::Data(Buf::from_bytes(&out, Dtype::U8)?),
        BufMut::from_bytes(&mut bytes, Dtype::U8)?,
        envelope,
    )?;
    if envelope.source == Peer::Null {
        return Ok(Announced {
            source: Peer::Null,
            tag: envelope.recvtag,
            mismatch: None,
        });
    }
    Ok(announced(&status, &bytes, expected))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_are_read_back_and_anything_else_is_no_header() {
        let message = Message {
            dtype: Dtype::C128,
            count: 7,
            tree: 0xfeed_0000_0000_0001,
        };
        assert_eq!(read_header(&header(message)), Some(message));
        assert_eq!(read_header(&[0u8; HEADER_BYTES]), None);
        assert_eq!(read_header(&[1, 2, 3]), None);
    }
}
