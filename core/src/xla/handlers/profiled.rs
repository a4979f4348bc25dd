//! A handler call as the profile records it (`xla/profile/`): what every exported handler's
//! path (`entry.rs`) hands each call to, once it has returned, while a profile records. Its
//! route (a jaxmpi op on an MPI communicator or on a MeshComm, or one of JAX's collectives
//! through the pass), the communicator or device, the bytes it sends, the call site the
//! program named, and a started op's request.

use std::sync::atomic::{AtomicU64, Ordering};

use super::requests::nonblocking::request_key;
use super::signature::Signature;
use crate::xla::ffi::{AttrType, ByteSpan, CallFrame, DataType, FfiError, Scalar};
use crate::xla::frame::{handles, Call};
use crate::xla::mesh::is_mesh_comm;
use crate::xla::profile::{Begun, Fields, Kind, Route};

/// Records the handler call on `frame` that has just returned `error` (of the op `name`,
/// its started form where `started`), begun at `begun`. Out of line and cold: the
/// handlers' own code stays what it is without profiles.
///
/// # Safety
/// `frame` must be the call frame from XLA the call ran on, still alive.
#[cold]
#[inline(never)]
pub(super) unsafe fn record(
    begun: Begun,
    frame: *mut CallFrame,
    name: &'static str,
    started: bool,
    error: *mut FfiError,
) {
    // SAFETY: forwarded from the caller: XLA's frame (not its metadata probe, which
    // `entry.rs` answers before), alive until the handler returns.
    if let Some(call) = unsafe { Call::observed(frame, name) } {
        record_call(begun, &call, started, error.is_null());
    }
}

/// Records `call` (an op's started form where `started`), begun at `begun`; `ok`: whether
/// it succeeded. The call is read as it is: where its results begin is no concern here.
fn record_call(begun: Begun, call: &Call, started: bool, ok: bool) {
    let name = call.name();
    let pass = name.starts_with("hlo_");
    // What the program named it by: a jax.named_scope (the lowering's `site`, passed
    // while a profile records), or the JAX operation an XLA collective came from.
    let (comm_id, site) = scan(call, if pass { "origin" } else { "site" });
    let route = if pass {
        Route::Pass
    } else if is_mesh_comm(comm_id) {
        Route::MeshComm
    } else {
        Route::Jaxmpi
    };
    let kind = match (started, name) {
        (true, _) => Kind::Start,
        (false, "wait") => Kind::Wait,
        _ => Kind::Call,
    };
    let (group, device) = match route {
        Route::Jaxmpi | Route::Plugin => (
            handles::resolve(handles::Table::Comm, comm_id).unwrap_or(0) as u64,
            -1,
        ),
        Route::MeshComm => ((-comm_id - 1) as u64, call.device().unwrap_or(-1)),
        Route::Pass => (0, call.device().unwrap_or(-1)),
    };
    let bytes = match kind {
        // Its bytes are its start's.
        Kind::Wait => 0,
        _ => call.operand_bytes(variadic(name)) as u64,
    };
    begun.record(&Fields {
        name,
        site: site.unwrap_or(""),
        route,
        kind,
        bytes,
        group,
        comm_id: comm_id as i32,
        device: device as i32,
        request: match kind {
            Kind::Start | Kind::Wait => request_key(call, started),
            _ => 0,
        },
        waited: 0,
        failed: !ok,
    });
}

/// The call's communicator (its `comm` attribute, 0 if none) and the text of its
/// attribute `site` if it has one: one pass over its attributes, where `Call`'s
/// accessors would take one each.
fn scan<'a>(call: &Call<'a>, site: &str) -> (i64, Option<&'a str>) {
    let attrs = &call.frame().attrs;
    let (mut comm, mut text) = (0, None);
    for i in 0..usize::try_from(attrs.size).unwrap_or(0) {
        // SAFETY: XLA gives `size` entries in each array; names are byte spans, alive as
        // long as the frame.
        let (kind, key, value) = unsafe {
            let span = &**attrs.names.add(i);
            let key = std::slice::from_raw_parts(span.ptr as *const u8, span.len);
            (*attrs.types.add(i), key, *attrs.attrs.add(i))
        };
        if key == b"comm" && kind == AttrType::SCALAR {
            // SAFETY: a SCALAR attribute points to an XLA_FFI_Scalar, of the type it says.
            let scalar = unsafe { &*(value as *const Scalar) };
            if scalar.dtype == DataType::S64 {
                // SAFETY: an S64 scalar's value is an i64.
                comm = unsafe { *(scalar.value as *const i64) };
            }
        } else if key == site.as_bytes() && kind == AttrType::STRING {
            // SAFETY: a STRING attribute points to a byte span, alive as long as the frame.
            let bytes = unsafe {
                let span = &*(value as *const ByteSpan);
                std::slice::from_raw_parts(span.ptr as *const u8, span.len)
            };
            text = std::str::from_utf8(bytes).ok();
        }
    }
    (comm, text)
}

/// Whether the op `name` counts every operand as sent (one declared operand that XLA may
/// hand over as several arrays), as `CallInfo` counts its bytes; remembered by the name's
/// address, so that a call does not search the op table.
fn variadic(name: &'static str) -> bool {
    const PLACES: usize = 64;
    static KNOWN: [AtomicU64; PLACES] = [const { AtomicU64::new(0) }; PLACES];
    let address = name.as_ptr() as u64;
    let place = &KNOWN[((address ^ (address >> 7)) as usize) % PLACES];
    let known = place.load(Ordering::Relaxed);
    if known >> 1 == address {
        return known & 1 == 1;
    }
    let variadic = Signature::named(name).is_some_and(|(s, _)| s.operands.len() == 1);
    place.store(address << 1 | u64::from(variadic), Ordering::Relaxed);
    variadic
}
