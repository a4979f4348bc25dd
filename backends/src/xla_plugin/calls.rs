//! The MPI calls XLA's CPU collectives make (the same 15 in jaxlib 0.6.2 to 0.12), each on
//! the process's library through jaxmpi's portable ops, tracked by jaxmpi's monitor
//! (`JAXMPI_DEBUG`, `JAXMPI_TIMEOUT`) like jaxmpi's own. Queries (rank, size, thread,
//! error text) are not tracked: they are not communication.
//!
//! One MPI per process: MPI_Init_thread takes the library jaxmpi (or mpi4py) already
//! initialized, or selects and initializes it (at MPI_THREAD_MULTIPLE) by jaxmpi's rules;
//! MPI_Finalize finalizes only what jaxmpi initialized, and not before jaxmpi's own exit
//! where jaxmpi's runtime will do it; freeing a communicator after that is harmless.

use std::ffi::{c_char, c_int, c_void};
use std::sync::atomic::Ordering;

use jaxmpi_core::xla::plugin_calls::{debug_note, track, XlaCall};
use jaxmpi_core::{
    Buf, BufMut, Comm, Dtype, Envelope, Error, Input, Library, Peer, Progress, Request, Result,
    Status, ThreadLevel,
};

use super::encoding::{self, Started, COMM_NULL, IN_PLACE, REQUEST_NULL, STATUS_IGNORE};
use super::{answer, failure_message, library, RUNTIME_FINALIZES};

/// What the unsupported functions' message lists.
pub(super) const IMPLEMENTED: [&str; 15] = [
    "MPI_Init_thread",
    "MPI_Finalize",
    "MPI_Is_thread_main",
    "MPI_Comm_rank",
    "MPI_Comm_size",
    "MPI_Comm_split",
    "MPI_Comm_free",
    "MPI_Allreduce",
    "MPI_Allgather",
    "MPI_Reduce_scatter",
    "MPI_Sendrecv",
    "MPI_Isend",
    "MPI_Irecv",
    "MPI_Wait",
    "MPI_Error_string",
];

/// The library every call after XLA's MPI_Init_thread uses.
fn installed() -> Result<&'static dyn Library> {
    jaxmpi_core::library()
}

/// Stores `value` where XLA asked for a result.
fn put<T>(function: &'static str, out: *mut T, value: T) -> Result<()> {
    if out.is_null() {
        return Err(Error::invalid_argument(
            function,
            "a result pointer is NULL",
        ));
    }
    // SAFETY: XLA passes the address of a `T` it owns for the call (checked non-NULL).
    unsafe { out.write(value) };
    Ok(())
}

/// The communicator, element type and element count most calls pass.
fn buffer_args(
    function: &'static str,
    library: &dyn Library,
    (comm, datatype, n): (usize, usize, c_int),
) -> Result<(Comm, Dtype, usize)> {
    let comm = encoding::comm(function, comm, library)?;
    Ok((
        comm,
        encoding::dtype(function, datatype)?,
        count(function, n)?,
    ))
}

fn count(function: &'static str, count: c_int) -> Result<usize> {
    usize::try_from(count)
        .map_err(|_| Error::invalid_argument(function, format!("negative count {count}")))
}

/// XLA's send buffer of `count` elements.
///
/// # Safety
/// `ptr` must hold `count` elements of `dtype`, alive and unchanged for the call.
unsafe fn send_buf<'a>(ptr: *const c_void, count: usize, dtype: Dtype) -> Buf<'a> {
    // SAFETY: forwarded from the caller.
    unsafe { Buf::from_raw(ptr.cast(), count, dtype) }
}

/// XLA's receive buffer of `count` elements.
///
/// # Safety
/// `ptr` must hold `count` elements of `dtype`, alive and written by nobody else for the
/// call (or, for a started receive, until its wait).
unsafe fn recv_buf<'a>(ptr: *mut c_void, count: usize, dtype: Dtype) -> BufMut<'a> {
    // SAFETY: forwarded from the caller.
    unsafe { BufMut::from_raw(ptr.cast(), count, dtype) }
}

/// Fills MPItrampoline's status (unless XLA passed MPI_STATUS_IGNORE, as it always does).
fn put_status(function: &'static str, out: *mut c_void, status: Option<&Status>) -> Result<()> {
    if out as usize == STATUS_IGNORE {
        return Ok(());
    }
    let (source, tag, error) = match status {
        Some(s) => {
            let source = match s.source {
                Peer::Rank(rank) => rank,
                Peer::Any | Peer::Null => super::contract::MPIABI_PROC_NULL,
            };
            let tag = s.tag.unwrap_or(super::contract::MPIABI_ANY_TAG);
            (source, tag, s.error)
        }
        // An empty status: what MPI reports for a send or a null request.
        None => (
            super::contract::MPIABI_ANY_SOURCE,
            super::contract::MPIABI_ANY_TAG,
            encoding::SUCCESS,
        ),
    };
    for (offset, value) in encoding::STATUS_FIELDS
        .into_iter()
        .zip([source, tag, error])
    {
        // SAFETY: a non-ignored status points to a 40-byte MPIABI_Status of XLA's.
        let field = unsafe { out.cast::<u8>().add(offset) }.cast::<c_int>();
        put(function, field, value)?;
    }
    Ok(())
}

#[no_mangle]
#[allow(non_snake_case)]
extern "C" fn MPIABI_Init_thread(
    _argc: *mut c_int,
    _argv: *mut *mut *mut c_char,
    _required: c_int,
    provided: *mut c_int,
) -> c_int {
    const F: &str = "MPI_Init_thread";
    answer(F, || {
        let library = library()?;
        let level = library.thread_level();
        debug_note(library, || {
            let by = if library.initialized_here() {
                "jaxmpi"
            } else {
                "another library (mpi4py?)"
            };
            format!(
                "{F} for XLA: MPI is initialized, by {by}, at {}",
                level.name()
            )
        });
        put(F, provided, encoding::thread_level(level))
    })
}

#[no_mangle]
#[allow(non_snake_case)]
extern "C" fn MPIABI_Finalize() -> c_int {
    const F: &str = "MPI_Finalize";
    answer(F, || {
        let Ok(library) = installed() else {
            return Ok(()); // XLA never initialized: nothing of jaxmpi's to finalize
        };
        if RUNTIME_FINALIZES.load(Ordering::SeqCst) {
            debug_note(library, || format!("{F} for XLA: left to jaxmpi's exit"));
            return Ok(());
        }
        let call = XlaCall::on(F, library.world(), 0);
        track(library, &call, || library.finalize())
    })
}

/// XLA creates communicators only on the thread that initialized MPI; its pool threads
/// create them too, and under MPI_THREAD_MULTIPLE any thread may, which is what XLA's
/// check is for.
#[no_mangle]
#[allow(non_snake_case)]
extern "C" fn MPIABI_Is_thread_main(flag: *mut c_int) -> c_int {
    const F: &str = "MPI_Is_thread_main";
    answer(F, || {
        let level = installed()?.thread_level();
        if level < ThreadLevel::Multiple {
            static SAID: std::sync::Once = std::sync::Once::new();
            SAID.call_once(|| {
                eprintln!(
                    "jaxmpi: JAX's collectives over MPI need MPI_THREAD_MULTIPLE (XLA calls MPI \
                     from its worker threads), but MPI was initialized with {}. Let jaxmpi or \
                     mpi4py initialize MPI (both ask for MULTIPLE), or use \
                     jaxmpi.distributed.initialize(collectives=\"gloo\").",
                    level.name()
                )
            });
        }
        put(F, flag, c_int::from(level == ThreadLevel::Multiple))
    })
}

/// A communicator's rank or size, which XLA asks right after each split.
fn comm_query(
    function: &'static str,
    comm: usize,
    out: *mut c_int,
    query: fn(&dyn Library, Comm) -> Result<i32>,
) -> c_int {
    answer(function, || {
        let library = installed()?;
        put(
            function,
            out,
            query(library, encoding::comm(function, comm, library)?)?,
        )
    })
}

#[no_mangle]
#[allow(non_snake_case)]
extern "C" fn MPIABI_Comm_rank(comm: usize, rank: *mut c_int) -> c_int {
    comm_query("MPI_Comm_rank", comm, rank, |library, comm| {
        library.comm_rank(comm)
    })
}

#[no_mangle]
#[allow(non_snake_case)]
extern "C" fn MPIABI_Comm_size(comm: usize, size: *mut c_int) -> c_int {
    comm_query("MPI_Comm_size", comm, size, |library, comm| {
        library.comm_size(comm)
    })
}

#[no_mangle]
#[allow(non_snake_case)]
extern "C" fn MPIABI_Comm_split(comm: usize, color: c_int, key: c_int, part: *mut usize) -> c_int {
    const F: &str = "MPI_Comm_split";
    answer(F, || {
        let library = installed()?;
        let comm = encoding::comm(F, comm, library)?;
        let call = XlaCall::on(F, comm, 0);
        let mut split = None;
        track(library, &call, || {
            split = library.comm_split(comm, encoding::color(color), key)?;
            Ok(())
        })?;
        put(F, part, encoding::new_comm(split))
    })
}

#[no_mangle]
#[allow(non_snake_case)]
extern "C" fn MPIABI_Comm_free(comm: *mut usize) -> c_int {
    const F: &str = "MPI_Comm_free";
    answer(F, || {
        let library = installed()?;
        if comm.is_null() {
            return Err(Error::invalid_argument(
                F,
                "the communicator pointer is NULL",
            ));
        }
        // SAFETY: XLA passes the address of its communicator handle (checked non-NULL).
        let handle = unsafe { comm.read() };
        let part = encoding::comm(F, handle, library)?;
        encoding::free_comm(part);
        // XLA frees its communicators when its client is destroyed, at exit, after JAX's
        // atexit finalized MPI: nothing is left to free then.
        if !library.finalized() {
            let call = XlaCall::on(F, part, 0);
            track(library, &call, || library.comm_free(part))?;
        }
        put(F, comm, COMM_NULL)
    })
}

#[no_mangle]
#[allow(non_snake_case)]
extern "C" fn MPIABI_Allreduce(
    send: *const c_void,
    recv: *mut c_void,
    n: c_int,
    datatype: usize,
    op: usize,
    comm: usize,
) -> c_int {
    const F: &str = "MPI_Allreduce";
    answer(F, || {
        let library = installed()?;
        let (comm, dtype, n) = buffer_args(F, library, (comm, datatype, n))?;
        let op = encoding::reduce_op(F, op)?;
        // XLA may reduce a buffer into itself; MPI wants MPI_IN_PLACE for that.
        let in_place = send as usize == IN_PLACE || (std::ptr::eq(send, recv) && n > 0);
        let input = if in_place {
            Input::InPlace
        } else {
            // SAFETY: XLA's buffer of `n` elements, alive and unchanged for the call.
            Input::Data(unsafe { send_buf(send, n, dtype) })
        };
        // SAFETY: XLA's result buffer of `n` elements, alive for the call.
        let output = unsafe { recv_buf(recv, n, dtype) };
        let call = XlaCall::on(F, comm, n * dtype.size());
        track(library, &call, || {
            library.backend().allreduce(comm, input, output, op)
        })
    })
}

/// The one datatype of a call that passes two, which must be the same.
fn same_type(function: &'static str, send: usize, recv: usize) -> Result<Dtype> {
    let dtype = encoding::dtype(function, send)?;
    if encoding::dtype(function, recv)? != dtype {
        return Err(Error::invalid_argument(
            function,
            "send and receive datatypes differ",
        ));
    }
    Ok(dtype)
}

#[no_mangle]
#[allow(non_snake_case)]
extern "C" fn MPIABI_Allgather(
    send: *const c_void,
    send_count: c_int,
    send_type: usize,
    recv: *mut c_void,
    recv_count: c_int,
    recv_type: usize,
    comm: usize,
) -> c_int {
    const F: &str = "MPI_Allgather";
    answer(F, || {
        let library = installed()?;
        let comm = encoding::comm(F, comm, library)?;
        let dtype = same_type(F, send_type, recv_type)?;
        let n = count(F, send_count)?;
        if send as usize == IN_PLACE || count(F, recv_count)? != n {
            return Err(Error::unsupported(
                F,
                "only equal send and receive counts and no MPI_IN_PLACE (as XLA calls it)",
            ));
        }
        let size = library.comm_size(comm)? as usize;
        // SAFETY: XLA's buffers: `n` elements to send, `n` per rank to receive.
        let (input, output) =
            unsafe { (send_buf(send, n, dtype), recv_buf(recv, n * size, dtype)) };
        let call = XlaCall::on(F, comm, n * dtype.size());
        track(library, &call, || {
            library.backend().allgather(comm, input, output)
        })
    })
}

#[no_mangle]
#[allow(non_snake_case)]
extern "C" fn MPIABI_Reduce_scatter(
    send: *const c_void,
    recv: *mut c_void,
    recv_counts: *const c_int,
    datatype: usize,
    op: usize,
    comm: usize,
) -> c_int {
    const F: &str = "MPI_Reduce_scatter";
    answer(F, || {
        let library = installed()?;
        let comm = encoding::comm(F, comm, library)?;
        let (dtype, op) = (encoding::dtype(F, datatype)?, encoding::reduce_op(F, op)?);
        let size = library.comm_size(comm)? as usize;
        if recv_counts.is_null() {
            return Err(Error::invalid_argument(F, "recvcounts is NULL"));
        }
        // SAFETY: MPI_Reduce_scatter's recvcounts has one entry per rank of the communicator.
        let counts = unsafe { std::slice::from_raw_parts(recv_counts, size) };
        let n = count(F, counts[0])?;
        if counts.iter().any(|&c| c != counts[0]) {
            return Err(Error::unsupported(
                F,
                format!("only equal counts per rank (as XLA calls it), not {counts:?}"),
            ));
        }
        // SAFETY: XLA's buffers: `n` elements per rank to reduce, `n` to receive.
        let (input, output) =
            unsafe { (send_buf(send, n * size, dtype), recv_buf(recv, n, dtype)) };
        let call = XlaCall::on(F, comm, n * size * dtype.size());
        track(library, &call, || {
            library.backend().reduce_scatter(comm, input, output, op)
        })
    })
}

/// A rank as the debug line shows it (`None`: no rank, as for ANY_SOURCE or PROC_NULL).
fn shown(peer: Peer) -> Option<i32> {
    match peer {
        Peer::Rank(rank) => Some(rank),
        Peer::Any | Peer::Null => None,
    }
}

#[no_mangle]
#[allow(non_snake_case)]
extern "C" fn MPIABI_Sendrecv(
    send: *const c_void,
    send_count: c_int,
    send_type: usize,
    dest: c_int,
    send_tag: c_int,
    recv: *mut c_void,
    recv_count: c_int,
    recv_type: usize,
    source: c_int,
    recv_tag: c_int,
    comm: usize,
    status: *mut c_void,
) -> c_int {
    const F: &str = "MPI_Sendrecv";
    answer(F, || {
        let library = installed()?;
        let comm = encoding::comm(F, comm, library)?;
        let (send_dtype, recv_dtype) = (
            encoding::dtype(F, send_type)?,
            encoding::dtype(F, recv_type)?,
        );
        let (n_send, n_recv) = (count(F, send_count)?, count(F, recv_count)?);
        let envelope = Envelope {
            comm,
            dest: encoding::peer(F, dest)?,
            sendtag: send_tag,
            source: encoding::peer(F, source)?,
            recvtag: encoding::tag(recv_tag),
        };
        // SAFETY: XLA's distinct send and receive blocks, alive for the call.
        let (input, output) = unsafe {
            (
                send_buf(send, n_send, send_dtype),
                recv_buf(recv, n_recv, recv_dtype),
            )
        };
        let call = XlaCall {
            dest: shown(envelope.dest),
            source: shown(envelope.source),
            ..XlaCall::on(F, comm, n_send * send_dtype.size())
        };
        let mut received = None;
        track(library, &call, || {
            received = Some(
                library
                    .backend()
                    .sendrecv(Input::Data(input), output, envelope)?,
            );
            Ok(())
        })?;
        put_status(F, status, received.as_ref())
    })
}

#[no_mangle]
#[allow(non_snake_case)]
extern "C" fn MPIABI_Isend(
    buf: *const c_void,
    n: c_int,
    datatype: usize,
    dest: c_int,
    tag: c_int,
    comm: usize,
    request: *mut usize,
) -> c_int {
    const F: &str = "MPI_Isend";
    answer(F, || {
        let library = installed()?;
        let (comm, dtype, n) = buffer_args(F, library, (comm, datatype, n))?;
        let dest = encoding::peer(F, dest)?;
        // SAFETY: XLA keeps the buffer alive and unchanged until its MPI_Wait on the request.
        let input = unsafe { send_buf(buf, n, dtype) };
        let call = XlaCall {
            dest: shown(dest),
            source: None,
            ..XlaCall::on(F, comm, n * dtype.size())
        };
        let mut started = None;
        track(library, &call, || {
            // SAFETY: as above.
            started = Some(unsafe { library.backend().isend(comm, input, dest, tag) }?);
            Ok(())
        })?;
        put(F, request, in_flight(started, call))
    })
}

#[no_mangle]
#[allow(non_snake_case)]
extern "C" fn MPIABI_Irecv(
    buf: *mut c_void,
    n: c_int,
    datatype: usize,
    source: c_int,
    tag: c_int,
    comm: usize,
    request: *mut usize,
) -> c_int {
    const F: &str = "MPI_Irecv";
    answer(F, || {
        let library = installed()?;
        let (comm, dtype, n) = buffer_args(F, library, (comm, datatype, n))?;
        let source = encoding::peer(F, source)?;
        // SAFETY: XLA keeps the buffer for this receive alone until its MPI_Wait.
        let output = unsafe { recv_buf(buf, n, dtype) };
        let call = XlaCall {
            dest: None,
            source: shown(source),
            ..XlaCall::on(F, comm, n * dtype.size())
        };
        let mut started = None;
        track(library, &call, || {
            let tag = encoding::tag(tag);
            // SAFETY: as above.
            started = Some(unsafe { library.backend().irecv(comm, output, source, tag) }?);
            Ok(())
        })?;
        put(F, request, in_flight(started, call))
    })
}

/// The handle XLA gets for a transfer it started.
fn in_flight(request: Option<Request>, call: XlaCall) -> usize {
    match request {
        Some(request) => encoding::new_request(Started { request, call }),
        None => REQUEST_NULL,
    }
}

#[no_mangle]
#[allow(non_snake_case)]
extern "C" fn MPIABI_Wait(request: *mut usize, status: *mut c_void) -> c_int {
    const F: &str = "MPI_Wait";
    answer(F, || {
        let library = installed()?;
        if request.is_null() {
            return Err(Error::invalid_argument(F, "the request pointer is NULL"));
        }
        // SAFETY: XLA passes the address of its request handle (checked non-NULL).
        let handle = unsafe { request.read() };
        if handle == REQUEST_NULL {
            return put_status(F, status, None); // MPI: a null request completes at once
        }
        let Started {
            request: mut transfer,
            call,
        } = encoding::take_request(F, handle)?;
        let call = XlaCall {
            function: F,
            ..call
        };
        let mut progress = Progress::Pending;
        track(library, &call, || {
            progress = library.backend().wait(&mut transfer)?;
            Ok(())
        })?;
        put(F, request, REQUEST_NULL)?;
        match progress {
            Progress::Received(received) => put_status(F, status, Some(&received)),
            Progress::Sent | Progress::Pending => put_status(F, status, None),
        }
    })
}

#[no_mangle]
#[allow(non_snake_case)]
extern "C" fn MPIABI_Error_string(code: c_int, text: *mut c_char, len: *mut c_int) -> c_int {
    const F: &str = "MPI_Error_string";
    // MPItrampoline's MPI_MAX_ERROR_STRING: XLA's buffer holds this many bytes.
    const ROOM: usize = 1024;
    answer(F, || {
        let message = failure_message(code)
            .map(|m| m.into_bytes())
            .unwrap_or_else(|| format!("MPI error {code} (MPI-5 ABI numbering)").into_bytes());
        let n = message.len().min(ROOM - 1);
        if text.is_null() {
            return Err(Error::invalid_argument(F, "the string pointer is NULL"));
        }
        // SAFETY: XLA's buffer holds ROOM bytes; `n + 1` of them are written.
        unsafe {
            std::ptr::copy_nonoverlapping(message.as_ptr(), text.cast::<u8>(), n);
            text.add(n).write(0);
        }
        put(F, len, n as c_int)
    })
}
