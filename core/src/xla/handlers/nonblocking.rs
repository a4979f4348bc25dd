//! The bodies of the non-blocking ops. A start (`isend`, `irecv`) returns a request value
//! (its key in `in_flight`, as two float32) and the buffer the transfer uses: for a send the
//! operand itself (aliased), for a receive the buffer MPI fills. The lowering hands that
//! buffer to the request's `wait` and to nothing else, so XLA keeps it alive and untouched
//! until the wait has completed, and every reader of received data runs after it.

use std::time::Instant;

use super::in_flight::{self, Flight};
use super::lifecycle::CallInfo;
use super::signature::Address;
use super::{attrs, Call};
use crate::{library, Backend, Comm, ErrorsReturned, Library, Request, Result};

/// Results of a start: the request value, then the buffer of the transfer.
const REQUEST: usize = 0;
const TRANSFER: usize = 1;

fn register(
    call: &Call,
    comm: Comm,
    request: Request,
    buffer: usize,
    status: Address,
) -> Result<()> {
    let library = library()?;
    let flight = Flight {
        request,
        op: call.name(),
        call: CallInfo::of(call),
        buffer,
        status,
        started: Instant::now(),
        _errors: ErrorsReturned::on(library, comm)?,
    };
    let key = in_flight::start(library, flight)?;
    let value = call.ret(REQUEST)?;
    // SAFETY: the request result is two float32 (checked by the Python shape rule).
    unsafe { std::ptr::write_unaligned(value.data().cast::<[u32; 2]>(), encode(key)) };
    Ok(())
}

/// The wait of a request started outside any program (eagerly), given its request value's
/// bits and its buffer's address: blocks until the request completes.
pub fn wait_eager(value: [u32; 2], buffer: usize) -> Result<()> {
    let library = library()?;
    let key = decode(value).ok_or_else(|| {
        crate::Error::invalid_argument("request", "is not a request value made by isend/irecv")
    })?;
    in_flight::wait(library, key, buffer, || None)
        .map_err(|err| super::entry::with_rank(err.in_op("wait"), library))
}

/// The request value is float32 for JAX's derivative rules, which may add a zero to it:
/// each half of the key is stored as the mantissa of a float in [1, 2), which adding zero
/// (or multiplying by one) leaves bit for bit as it is, as no subnormal would be.
const ONE: u32 = 0x3F80_0000;
const MANTISSA: u64 = 0x7F_FFFF;

fn encode(key: u64) -> [u32; 2] {
    [
        ONE | (key & MANTISSA) as u32,
        ONE | ((key >> 23) & MANTISSA) as u32,
    ]
}

fn decode(value: [u32; 2]) -> Option<u64> {
    let [lo, hi] = value;
    let part = |v: u32| (v & !(MANTISSA as u32) == ONE).then_some(u64::from(v) & MANTISSA);
    Some(part(lo)? | part(hi)? << 23)
}

pub fn isend(call: &Call, _: &dyn Library, backend: &dyn Backend, a: &attrs::Isend) -> Result<()> {
    let buffer = call.ret(TRANSFER)?;
    // SAFETY: the transfer buffer (the operand, aliased) is an operand of the request's wait
    // and of nothing that writes it: XLA keeps it alive and unchanged until the wait has
    // completed, which only happens once MPI is done with it.
    let request = unsafe { backend.isend(a.comm, buffer.buf()?, a.dest, a.tag) }?;
    register(call, a.comm, request, buffer.data() as usize, Address(0))
}

pub fn irecv(call: &Call, _: &dyn Library, backend: &dyn Backend, a: &attrs::Irecv) -> Result<()> {
    let buffer = call.ret(TRANSFER)?;
    // SAFETY: the buffer is a result only the request's wait reads (and aliases to its own
    // result): alive until the wait has completed, written by nobody but MPI.
    let request = unsafe { backend.irecv(a.comm, buffer.buf_mut()?, a.source, a.tag) }?;
    register(call, a.comm, request, buffer.data() as usize, a.status)
}

pub fn wait(call: &Call, _: &dyn Library, _: &dyn Backend, _: &attrs::Wait) -> Result<()> {
    let value = call.arg(0)?;
    let not_a_request = || call.bad_attr("request", "is not a request value made by isend/irecv");
    if value.count() * value.dtype()?.size() != 8 {
        return Err(not_a_request());
    }
    // SAFETY: checked above: 8 bytes, the request value its start wrote.
    let bits = unsafe { std::ptr::read_unaligned(value.data().cast::<[u32; 2]>()) };
    let key = decode(bits).ok_or_else(not_a_request)?;
    in_flight::wait(library()?, key, call.arg(1)?.data() as usize, || {
        call.defer()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_keys_survive_as_floats_that_adding_zero_keeps() {
        for key in [1, 2, 0x7F_FFFF, 0x80_0000, (1 << 46) - 1] {
            let bits = encode(key);
            let floats = bits.map(f32::from_bits);
            assert!(floats
                .iter()
                .all(|f| f.is_normal() && (1.0..2.0).contains(f)));
            let plus_zero = floats.map(|f| (f + 0.0).to_bits());
            assert_eq!(decode(plus_zero), Some(key));
        }
        assert_eq!(decode([0, 0]), None);
    }
}
