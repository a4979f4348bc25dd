//! What a completed receive leaves, the same for a blocking receive or sendrecv
//! (`ops.rs`) and for a started receive at its completion (`requests/flights.rs`): the
//! whole message checked, since MPI allows a shorter one and leaves the rest of the buffer
//! unwritten, and the mpi4py Status filled in.

use crate::xla::frame::Address;
use crate::{Backend, BufMut, Error, Peer, Result, Status};

/// Copies the library's MPI_Status into the mpi4py `Status` whose address the lowering
/// passed, so `status.Get_source()` etc. work after a jitted receive.
pub(super) fn fill_status(Address(address): Address, status: &Status) {
    if address != 0 {
        let native = status.native.as_bytes();
        // SAFETY: the lowering passes the address of the MPI_Status inside a live mpi4py
        // Status object of the same library, which is exactly `native.len()` bytes.
        unsafe { std::ptr::copy_nonoverlapping(native.as_ptr(), address as *mut u8, native.len()) };
    }
}

/// MPI allows a message shorter than the receive buffer, and leaves the rest of it
/// unwritten: never handed on as data. With a `status` the caller reads the count there
/// and the rest of the result is zeros; without one the short message is an error.
pub(super) fn whole_message(
    y: BufMut,
    status: &Status,
    address: Address,
    backend: &dyn Backend,
) -> Result<()> {
    let expected = y.count();
    if status.source == Peer::Null || status.count >= expected {
        return Ok(());
    }
    if address.0 != 0 {
        return backend.fill_zeros(y.tail(status.count));
    }
    let tag = status.tag.map_or("none".to_string(), |t| t.to_string());
    Err(Error::invalid_argument(
        "short message",
        format!(
            "received {} of {expected} {} elements from rank {} (tag {tag}): the message is \
             shorter than the receive buffer. Receive with the sender's shape, or pass \
             status= to accept shorter messages (the count is then in the status and the \
             rest of the result is zeros)",
            status.count,
            y.dtype(),
            status.source,
        ),
    ))
}
