//! Non-blocking ops: every op declared with a started form (`started iname` in the table
//! in `handlers/mod.rs`) starts through `start`, and every request completes through
//! `wait`.
//!
//! A start runs the op's own body (`handlers/ops.rs`) through `Backend::start`, which makes every
//! MPI call the body makes non-blocking (MPI_Iallreduce for MPI_Allreduce, ...): the same
//! checks, chunks and segments as the blocking op, then the requests in flight
//! (`in_flight.rs`) under one key, which the start writes into its request value. Its other
//! results are the op's own (what MPI fills) and the operands the transfer reads, passed
//! through: the lowering hands them to the request's `wait` and to nothing else, so XLA keeps
//! them alive and untouched until the wait has completed, and every reader of the op's
//! results runs after it. A receive's status and whole-message check come at completion.

use std::time::Instant;

use super::flights::{Flight, Receive};
use super::{in_flight, progress};
use crate::xla::frame::{Address, Attrs, Call, Operand};
use crate::xla::handlers::services::call_info::{with_rank, CallInfo};
use crate::xla::handlers::signature::Signature;
use crate::xla::handlers::{attrs, Body};
use crate::{library, Backend, ErrorsReturned, Library, Result};

/// Starts the op `body` is the body of, on `call`'s buffers (see the module's doc).
pub(in crate::xla::handlers) fn start<A: Attrs>(
    call: &Call,
    library: &dyn Library,
    backend: &dyn Backend,
    attrs: &A,
    body: Body<A>,
) -> Result<()> {
    // None on a MeshComm, whose communicators among processes return errors
    // from the start.
    let comm = attrs.comm();
    let collective = Signature::named(call.name()).is_some_and(|(s, _)| s.is_collective());
    if collective && progress::collectives_complete_at_start(library) {
        // Nothing could move its data before the wait (`progress_mode`): the blocking op,
        // now; its wait has nothing left to do.
        body(call, library, backend, attrs)?;
        return write_request(call, COMPLETED);
    }
    // SAFETY: the lowering hands every buffer of this call (the op's results, and the
    // operands MPI reads, passed through) to the request's wait and to nothing that writes
    // them: XLA keeps them alive and unchanged until the wait has completed, which only
    // happens once MPI is done with them.
    let started = unsafe { backend.start(&mut |starting| body(call, library, starting, attrs)) }?;
    let library = crate::library()?;
    // The buffer the wait is handed first: the op's first result, else the first operand.
    let first = call.optional_ret(0).or_else(|| call.optional_arg(0));
    let receive = match started.requests.iter().any(|r| r.receives.is_some()) {
        true => call.optional_ret(0).map(|y| receive_of(&y)).transpose()?,
        false => None,
    };
    let flight = Flight {
        requests: started.requests,
        _keep: started.keep,
        op: call.name(),
        call: CallInfo::of(call),
        buffer: first.map_or(0, |b| b.data() as usize),
        status: attrs.status().unwrap_or(Address(0)),
        receive,
        results: call.rets_len(),
        started: Instant::now(),
        key: 0,
        _errors: comm
            .map(|comm| ErrorsReturned::on(library, comm))
            .transpose()?,
    };
    let key = in_flight::start(library, flight)?;
    write_request(call, key)
}

/// The key of a request that completed at its start: no entry in flight (keys start at 1).
const COMPLETED: u64 = 0;

fn write_request(call: &Call, key: u64) -> Result<()> {
    let value = call.request()?;
    if value.len_bytes() != 8 {
        return Err(call.bad_attr("request", "result is not the 8-byte request value"));
    }
    // SAFETY: checked above: the request result is 8 bytes, two float32.
    unsafe { std::ptr::write_unaligned(value.data().cast::<[u32; 2]>(), encode(key)) };
    Ok(())
}

fn receive_of(y: &Operand) -> Result<Receive> {
    Ok(Receive {
        data: y.data() as usize,
        count: y.count(),
        dtype: y.dtype()?,
    })
}

/// The wait of a request started outside any program (eagerly), given its request value's
/// bits and its first buffer's address: blocks until the request completes.
pub fn wait_eager(value: [u32; 2], buffer: usize) -> Result<()> {
    let library = library()?;
    let key = decode(value).ok_or_else(|| {
        crate::Error::invalid_argument("request", "is not a request value made by a started op")
    })?;
    if key == COMPLETED {
        return Ok(());
    }
    in_flight::wait(library, key, buffer, || None)
        .map_err(|err| with_rank(err.in_op("wait"), library))
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

/// The request a started op's call (`started`) or a wait's call is about (0: neither, or
/// none): what the profile links a start, its wait and its completion by.
pub(in crate::xla::handlers) fn request_key(call: &Call, started: bool) -> u64 {
    let value = match (started, call.name()) {
        (true, _) => call.request().ok(),
        (false, "wait") => call.arg(0).ok(),
        _ => None,
    };
    match value {
        Some(value) if value.len_bytes() == 8 => {
            // SAFETY: 8 bytes: a request value, its start's (written before this runs:
            // the start's call has returned, or is returning, its request).
            let bits = unsafe { std::ptr::read_unaligned(value.data().cast::<[u32; 2]>()) };
            decode(bits).unwrap_or(0)
        }
        _ => 0,
    }
}

fn decode(value: [u32; 2]) -> Option<u64> {
    let [lo, hi] = value;
    let part = |v: u32| (v & !(MANTISSA as u32) == ONE).then_some(u64::from(v) & MANTISSA);
    Some(part(lo)? | part(hi)? << 23)
}

pub fn wait(call: &Call, _: &dyn Library, _: &dyn Backend, _: &attrs::Wait) -> Result<()> {
    let value = call.arg(0)?;
    let not_a_request = || call.bad_attr("request", "is not a request value made by a started op");
    if value.len_bytes() != 8 {
        return Err(not_a_request());
    }
    // SAFETY: checked above: 8 bytes, the request value its start wrote.
    let bits = unsafe { std::ptr::read_unaligned(value.data().cast::<[u32; 2]>()) };
    let key = decode(bits).ok_or_else(not_a_request)?;
    if key == COMPLETED {
        return Ok(());
    }
    let first = call.optional_arg(1).map_or(0, |b| b.data() as usize);
    in_flight::wait(library()?, key, first, || call.defer())
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
