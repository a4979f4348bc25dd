//! XLA's values in the plug-in's encoding (the MPI-5 standard ABI's, `contract.rs`) turned
//! into jaxmpi's portable ones, which the loaded library's own tables then turn into its
//! handles: predefined datatypes and ops through `Standard::PREDEFINED`, communicators and
//! requests through the registries below (XLA only ever passes what this plug-in gave it).

use std::ffi::c_int;
use std::sync::{Mutex, MutexGuard};

use jaxmpi_core::xla::plugin_calls::XlaCall;
use jaxmpi_core::{Comm, Dtype, Error, ErrorKind, Library, Peer, ReduceOp, Request, Result};

use super::contract::{
    MPIABI_ANY_SOURCE, MPIABI_ANY_TAG, MPIABI_BYTE, MPIABI_COMM_NULL, MPIABI_COMM_WORLD,
    MPIABI_ERR_ARG, MPIABI_ERR_OTHER, MPIABI_ERR_UNSUPPORTED_OPERATION, MPIABI_IN_PLACE,
    MPIABI_PROC_NULL, MPIABI_REQUEST_NULL, MPIABI_STATUS_IGNORE, MPIABI_SUCCESS, MPIABI_UNDEFINED,
};
use crate::mpi::abi::{Abi, Standard};

pub(super) const SUCCESS: c_int = MPIABI_SUCCESS;
pub(super) const ERR_UNSUPPORTED_OPERATION: c_int = MPIABI_ERR_UNSUPPORTED_OPERATION;
pub(super) const COMM_NULL: usize = MPIABI_COMM_NULL;
pub(super) const REQUEST_NULL: usize = MPIABI_REQUEST_NULL;
pub(super) const STATUS_IGNORE: usize = MPIABI_STATUS_IGNORE;
pub(super) const IN_PLACE: usize = MPIABI_IN_PLACE;

/// The error code XLA gets for a failure (its text comes from MPI_Error_string).
pub(super) fn error_code(err: &Error) -> c_int {
    match err.kind {
        ErrorKind::InvalidArgument => MPIABI_ERR_ARG,
        ErrorKind::Unsupported => MPIABI_ERR_UNSUPPORTED_OPERATION,
        ErrorKind::Library | ErrorKind::Mpi { .. } => MPIABI_ERR_OTHER,
    }
}

fn invalid(function: &'static str, message: String) -> Error {
    Error::invalid_argument(function, message)
}

/// The element type of an MPI-5 ABI datatype XLA passes; MPI_BYTE moves bytes.
pub(super) fn dtype(function: &'static str, datatype: usize) -> Result<Dtype> {
    if datatype == MPIABI_BYTE {
        return Ok(Dtype::U8);
    }
    // The 16-bit floats share UINT16_T's entry; the first match is uint16 itself.
    let position = Standard::PREDEFINED
        .datatypes
        .iter()
        .position(|&d| d == datatype);
    position.map(|i| Dtype::ALL[i]).ok_or_else(|| {
        invalid(
            function,
            format!("datatype {datatype:#x} is not one XLA passes"),
        )
    })
}

pub(super) fn reduce_op(function: &'static str, op: usize) -> Result<ReduceOp> {
    let position = Standard::PREDEFINED.ops.iter().position(|&o| o == op);
    position.map(|i| ReduceOp::PREDEFINED[i]).ok_or_else(|| {
        invalid(
            function,
            format!("op {op:#x} is not a predefined reduction"),
        )
    })
}

/// A rank argument: a source may be MPI_ANY_SOURCE; either may be MPI_PROC_NULL.
pub(super) fn peer(function: &'static str, rank: c_int) -> Result<Peer> {
    match rank {
        r if r >= 0 => Ok(Peer::Rank(r)),
        r if r == MPIABI_ANY_SOURCE => Ok(Peer::Any),
        r if r == MPIABI_PROC_NULL => Ok(Peer::Null),
        r => Err(invalid(function, format!("{r} is not a rank"))),
    }
}

/// A receive's tag: `None` is MPI_ANY_TAG.
pub(super) fn tag(tag: c_int) -> Option<c_int> {
    (tag != MPIABI_ANY_TAG).then_some(tag)
}

/// A split's color: `None` is MPI_UNDEFINED.
pub(super) fn color(color: c_int) -> Option<c_int> {
    (color != MPIABI_UNDEFINED).then_some(color)
}

/// MPI_THREAD_SINGLE..MULTIPLE as the plug-in encodes them.
pub(super) fn thread_level(level: jaxmpi_core::ThreadLevel) -> c_int {
    use jaxmpi_core::ThreadLevel::*;
    let index = match level {
        Single => 0,
        Funneled => 1,
        Serialized => 2,
        Multiple => 3,
    };
    Standard::THREAD_LEVELS[index]
}

/// The communicators XLA holds: MPI_COMM_WORLD and those split from it here. XLA passes
/// nothing else, and an unknown handle is refused before the library sees it.
static COMMUNICATORS: Mutex<Vec<usize>> = Mutex::new(Vec::new());

/// One of the registries below, locked. Every update is one push or removal: a panic
/// cannot leave one half done, so a poisoned lock is taken over.
fn locked<T>(registry: &'static Mutex<Vec<T>>) -> MutexGuard<'static, Vec<T>> {
    registry
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn communicators() -> MutexGuard<'static, Vec<usize>> {
    locked(&COMMUNICATORS)
}

pub(super) fn comm(function: &'static str, handle: usize, library: &dyn Library) -> Result<Comm> {
    if handle == MPIABI_COMM_WORLD {
        return Ok(library.world());
    }
    if handle == MPIABI_COMM_NULL {
        return Err(invalid(
            function,
            "the communicator is MPI_COMM_NULL".into(),
        ));
    }
    if communicators().contains(&handle) {
        return Ok(Comm(handle));
    }
    Err(invalid(
        function,
        format!("{handle:#x} is no communicator this plug-in gave XLA"),
    ))
}

/// The handle XLA gets for a communicator split for it (`None`: MPI_COMM_NULL).
pub(super) fn new_comm(comm: Option<Comm>) -> usize {
    match comm {
        Some(comm) => {
            communicators().push(comm.0);
            comm.0
        }
        None => COMM_NULL,
    }
}

/// Forgets a communicator XLA frees.
pub(super) fn free_comm(comm: Comm) {
    communicators().retain(|&c| c != comm.0);
}

/// A transfer XLA started and has not waited for: its request, and the call that started
/// it (what the wait's debug line shows).
pub(super) struct Started {
    pub request: Request,
    pub call: XlaCall,
}

/// The transfers in flight, by their library handles (which no predefined MPI-5 handle
/// equals).
static REQUESTS: Mutex<Vec<Started>> = Mutex::new(Vec::new());

fn requests() -> MutexGuard<'static, Vec<Started>> {
    locked(&REQUESTS)
}

pub(super) fn new_request(started: Started) -> usize {
    let handle = started.request.raw;
    requests().push(started);
    handle
}

/// The started transfer `handle` names, no longer listed (XLA waits for each once).
pub(super) fn take_request(function: &'static str, handle: usize) -> Result<Started> {
    let mut requests = requests();
    let found = requests.iter().position(|s| s.request.raw == handle);
    found.map(|i| requests.swap_remove(i)).ok_or_else(|| {
        invalid(
            function,
            format!("{handle:#x} is no request this plug-in gave XLA"),
        )
    })
}

/// Byte offsets of MPI_SOURCE, MPI_TAG and MPI_ERROR in MPItrampoline's `MPIABI_Status`
/// (40 bytes: room for a native status first).
pub(super) const STATUS_FIELDS: [usize; 3] = [24, 28, 32];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::xla_plugin::contract::*;

    #[test]
    fn the_contract_is_the_standard_table_jaxmpi_loads_mpi_5_libraries_with() {
        let table = Standard::PREDEFINED;
        assert_eq!(MPIABI_COMM_WORLD, table.comm_world);
        assert_eq!(MPIABI_COMM_NULL, table.comm_null);
        let named = [
            (MPIABI_C_BOOL, Dtype::Bool),
            (MPIABI_INT8_T, Dtype::I8),
            (MPIABI_INT16_T, Dtype::I16),
            (MPIABI_INT32_T, Dtype::I32),
            (MPIABI_INT64_T, Dtype::I64),
            (MPIABI_UINT8_T, Dtype::U8),
            (MPIABI_UINT16_T, Dtype::U16),
            (MPIABI_UINT32_T, Dtype::U32),
            (MPIABI_UINT64_T, Dtype::U64),
            (MPIABI_FLOAT, Dtype::F32),
            (MPIABI_DOUBLE, Dtype::F64),
            (MPIABI_C_COMPLEX, Dtype::C64),
            (MPIABI_C_FLOAT_COMPLEX, Dtype::C64),
            (MPIABI_C_DOUBLE_COMPLEX, Dtype::C128),
            (MPIABI_BYTE, Dtype::U8),
        ];
        for (handle, want) in named {
            assert_eq!(dtype("test", handle), Ok(want), "{handle:#x}");
        }
        let ops = [
            (MPIABI_SUM, ReduceOp::Sum),
            (MPIABI_PROD, ReduceOp::Prod),
            (MPIABI_MIN, ReduceOp::Min),
            (MPIABI_MAX, ReduceOp::Max),
            (MPIABI_LAND, ReduceOp::Land),
            (MPIABI_BXOR, ReduceOp::Bxor),
        ];
        for (handle, want) in ops {
            assert_eq!(reduce_op("test", handle), Ok(want), "{handle:#x}");
        }
        let levels = [
            MPIABI_THREAD_SINGLE,
            MPIABI_THREAD_FUNNELED,
            MPIABI_THREAD_SERIALIZED,
            MPIABI_THREAD_MULTIPLE,
        ];
        assert_eq!(levels, Standard::THREAD_LEVELS);
        assert_eq!(
            (MPIABI_ANY_SOURCE, MPIABI_ANY_TAG, MPIABI_PROC_NULL),
            (Standard::ANY_SOURCE, Standard::ANY_TAG, Standard::PROC_NULL)
        );
    }

    #[test]
    fn peers_tags_and_colors_decode_their_wildcards() {
        assert_eq!(peer("f", 3), Ok(Peer::Rank(3)));
        assert_eq!(peer("f", MPIABI_ANY_SOURCE), Ok(Peer::Any));
        assert_eq!(peer("f", MPIABI_PROC_NULL), Ok(Peer::Null));
        assert!(peer("f", -77).is_err());
        assert_eq!(tag(MPIABI_ANY_TAG), None);
        assert_eq!(tag(0), Some(0));
        assert_eq!(color(MPIABI_UNDEFINED), None);
        assert_eq!(color(4), Some(4));
        assert!(dtype("f", 0x999).is_err());
        assert!(reduce_op("f", MPIABI_OP_NULL).is_err());
    }

    #[test]
    fn a_request_is_waited_for_once() {
        let request = Request {
            raw: 0x7f00_1234_5678,
            receives: None,
        };
        let call = XlaCall {
            function: "MPI_Isend",
            comm: Comm(0x8400_0002),
            dest: Some(1),
            source: None,
            bytes: 8,
        };
        let handle = new_request(Started { request, call });
        assert_eq!(
            take_request("MPI_Wait", handle).unwrap().request.raw,
            handle
        );
        let Err(again) = take_request("MPI_Wait", handle) else {
            panic!("a request was waited for twice");
        };
        assert!(again.message.contains("no request this plug-in gave XLA"));
    }
}
