//! `jaxmpi._native`: what Python needs from Rust — the handler capsules to register with
//! XLA, backend selection, communicator management (`comms.rs`), what the GPU side found
//! (`gpu.rs`), jaxmpi's own profile (`profile.rs`) and library information.
//! Every call that may block in MPI releases the GIL.

mod comms;
mod gpu;
mod profile;

use std::ffi::c_void;
use std::path::PathBuf;

use jaxmpi_backends::gpu::cuda;
use jaxmpi_backends::select::detect::SearchPath;
use jaxmpi_backends::xla_plugin;
use jaxmpi_core::xla::ffi::Handler;
use jaxmpi_core::xla::frame::{handles, Kind, OP_USER, PEER_ANY, PEER_NULL, TAG_ANY, USER_OP};
use jaxmpi_core::xla::handlers::requests::{in_flight, nonblocking, progress};
use jaxmpi_core::xla::handlers::services::{checked, pending, start_verdict};
use jaxmpi_core::xla::handlers::{
    ragged, register_mesh_comm, GPU_HANDLERS, HANDLERS, NON_BLOCKING, SIGNATURES, STARTED_RESULTS,
};
use jaxmpi_core::xla::mesh::reductions;
use jaxmpi_core::xla::{devices, hlo, mesh};
use jaxmpi_core::{library, Dtype, Error, ErrorKind, Library, ReduceOp};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBytes, PyCapsule, PyDict, PyType};

pyo3::create_exception!(
    _native,
    MPIError,
    PyRuntimeError,
    "An MPI call failed, or no usable MPI library could be set up."
);

/// `jaxmpi.MPIError`, once the package has registered it; until then `_native.MPIError`.
static ERROR_TYPE: PyOnceLock<Py<PyType>> = PyOnceLock::new();

fn to_py(err: Error) -> PyErr {
    if err.kind == ErrorKind::InvalidArgument {
        return PyValueError::new_err(err.to_string());
    }
    let message = format!("jaxmpi.{err}");
    Python::attach(|py| match ERROR_TYPE.get(py) {
        Some(error_type) => PyErr::from_type(error_type.bind(py).clone(), (message,)),
        None => MPIError::new_err(message),
    })
}

/// Makes every later MPI failure raise `error_type` (`jaxmpi.MPIError`) with the message.
#[pyfunction]
fn set_error_type(py: Python<'_>, error_type: Bound<'_, PyType>) {
    let _ = ERROR_TYPE.set(py, error_type.unbind());
}

fn installed() -> PyResult<&'static dyn Library> {
    library().map_err(to_py)
}

/// The HLO pass (`jaxmpi_core::xla::hlo`): `bytes`, a serialized HloModuleProto, with every
/// collective rewritten into a jaxmpi call, and how many; None when it holds none. A
/// module that cannot be taken whole raises ValueError saying which instruction and why.
#[pyfunction]
fn rewrite_hlo<'py>(
    py: Python<'py>,
    module: &[u8],
) -> PyResult<Option<(Bound<'py, PyBytes>, usize)>> {
    match hlo::rewrite_module(module) {
        Ok(None) => Ok(None),
        Ok(Some(done)) => Ok(Some((PyBytes::new(py, &done.module), done.collectives))),
        Err(refusal) => Err(PyValueError::new_err(refusal.to_string())),
    }
}

/// The id a program carries for the raw handle or address `raw` (`kind`: "comm" or
/// "address"), registered now if new: the same in every run of the same program.
#[pyfunction]
fn handle_id(kind: &str, raw: u64) -> PyResult<i64> {
    let table = match kind {
        "comm" => handles::Table::Comm,
        "address" => handles::Table::Address,
        other => return Err(PyValueError::new_err(format!("no handle kind {other:?}"))),
    };
    Ok(handles::id_of(table, raw as usize))
}

/// The FFI targets the HLO pass calls, by the HLO opcode each takes the place of; a
/// program's prologue (which makes its communicators) by none, "".
#[pyfunction]
fn hlo_targets() -> Vec<(&'static str, &'static str)> {
    let mut targets = hlo::TARGETS.to_vec();
    targets.push(("", hlo::PROLOGUE));
    targets
}

/// How reductions among devices combine (`JAXMPI_MESH_REDUCTIONS`): "fast" or "ordered",
/// read from the environment on the first call, for good.
#[pyfunction]
fn mesh_reductions() -> PyResult<&'static str> {
    reductions::reductions().map(|r| r.name()).map_err(to_py)
}

/// How many communicators among processes the device-rank layer holds in this process
/// (one for each set of devices its collectives, permutes' processes and MeshComms span;
/// at most `JAXMPI_MAX_COMMUNICATORS`).
#[pyfunction]
fn device_communicators() -> usize {
    mesh::communicators_held()
}

/// The HLO pass's revision (`hlo::REVISION`), which salts JAX's compilation cache.
#[pyfunction]
fn hlo_revision() -> u32 {
    hlo::REVISION
}

/// Tells the handlers of XLA's collectives which process (world rank) owns each device
/// of the job: `(device id, process index)` for every device, from `jax.devices()`.
#[pyfunction]
fn set_device_owners(owners: Vec<(i64, i32)>) -> PyResult<()> {
    devices::set_owners(&owners).map_err(to_py)
}

/// Registers a device communicator (`jaxmpi.MeshComm`): its groups of devices (global ids,
/// each group's in rank order), and makes its communicators among processes (collective
/// over them; the GIL is released meanwhile). Returns the negative id programs carry as
/// its `comm`.
#[pyfunction]
fn mesh_comm(py: Python<'_>, groups: Vec<Vec<i64>>) -> PyResult<i64> {
    on_library(py, "MeshComm", |library| {
        register_mesh_comm(library, groups)
    })
}

/// Keeps failures of ops without results for later (fast dispatch), or stops keeping them.
#[pyfunction]
fn keep_failures(on: bool) {
    pending::set_dispatching_thread_probe(on_python_thread);
    pending::enable(on);
}

/// Programs are dispatched from Python threads; XLA's own workers have no Python state.
fn on_python_thread() -> bool {
    // SAFETY: reads this thread's state pointer; needs neither the GIL nor initialization
    // beyond the interpreter that loaded this module.
    !unsafe { pyo3::ffi::PyGILState_GetThisThreadState() }.is_null()
}

/// Whether checked mode (`JAXMPI_CHECK=1`) is on.
#[pyfunction]
fn checked_mode() -> bool {
    checked::enabled()
}

/// Turns checked mode on or off from now on; every rank must do it at the same point.
#[pyfunction]
fn set_checked_mode(on: bool) {
    checked::set_enabled(on);
}

/// Whether start verdicts are on: before each blocking collective, its ranks agree that
/// every one can start its part (a GPU rank's preparation can fail alone).
#[pyfunction]
fn start_verdicts() -> bool {
    start_verdict::enabled()
}

/// Turns start verdicts on or off from now on. They add a message to every collective, so
/// every rank of the job must do it alike, before its first collective.
#[pyfunction]
fn set_start_verdicts(on: bool) {
    start_verdict::set_enabled(on);
}

/// The kept failure's message ("jaxmpi.<op> failed: ..."), now the caller's to raise.
#[pyfunction]
fn take_failure() -> Option<String> {
    pending::take().map(|err| format!("jaxmpi.{err}"))
}

/// Forgets the kept failure if `message`, an error already raised, reports it.
#[pyfunction]
fn discard_failure(message: &str) {
    pending::discard(message);
}

/// Selects, loads and initializes the MPI library once per process; later calls return at
/// once. `prefixes` are searched before the system path (sys.prefix and friends). From
/// then on jaxmpi's exit (`finalize`), not XLA's, finalizes MPI.
#[pyfunction]
fn init(py: Python<'_>, prefixes: Vec<PathBuf>) -> PyResult<()> {
    py.detach(|| jaxmpi_backends::select_with(&SearchPath { prefixes }).map(|_| ()))
        .map_err(to_py)?;
    xla_plugin::finalize_at_runtime_exit();
    Ok(())
}

/// Whether jaxlib's MPItrampoline loaded this module as its MPI library at `import jax`
/// (`MPITRAMPOLINE_LIB`), so that XLA's MPI collectives would run through jaxmpi.
#[pyfunction]
fn xla_plugin_loaded() -> bool {
    xla_plugin::loaded_by_jaxlib()
}

/// What was loaded and why: the content of `python -m jaxmpi info`.
#[pyfunction]
fn info(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let library = installed()?;
    let info = library.info();
    let dict = PyDict::new(py);
    dict.set_item("family", info.family.name())?;
    dict.set_item("path", info.path.display().to_string())?;
    dict.set_item("version_string", info.version_string.trim())?;
    dict.set_item("standard_version", info.standard_version)?;
    dict.set_item("chosen_by", &info.chosen_by)?;
    dict.set_item("thread_level", library.thread_level().name())?;
    dict.set_item("initialized_here", library.initialized_here())?;
    dict.set_item("cuda_aware", library.cuda_aware())?;
    dict.set_item("cuda_aware_reason", library.cuda_aware_reason())?;
    dict.set_item(
        "cuda_aware_checks_buffers",
        library.cuda_aware_checks_buffers(),
    )?;
    dict.set_item("any_source", info.any_source)?;
    dict.set_item("proc_null", info.proc_null)?;
    dict.set_item("any_tag", info.any_tag)?;
    // None: bound by the linker (the `linked` backend); else (function, file) per function
    // a profiling tool loaded ahead of MPI took over.
    let interposed = info.interposed.as_ref().map(|functions| {
        functions
            .iter()
            .map(|(name, file)| (name.clone(), file.display().to_string()))
            .collect::<Vec<_>>()
    });
    dict.set_item("interposed", interposed)?;
    let (progress, why) = progress::progress_mode(library);
    dict.set_item("progress", progress)?;
    dict.set_item("progress_reason", why)?;
    Ok(dict)
}

/// (target name, capsule) for every FFI handler of `platform` ("cpu" or "CUDA": the ops that
/// run on GPU buffers only). Asking for CUDA installs the CUDA GPU runtime; it loads
/// libcuda only when a GPU op first runs.
#[pyfunction]
#[pyo3(signature = (platform="cpu"))]
fn handlers<'py>(
    py: Python<'py>,
    platform: &str,
) -> PyResult<Vec<(&'static str, Bound<'py, PyCapsule>)>> {
    let table: &[(&str, Handler)] = match platform {
        "cpu" => HANDLERS,
        "CUDA" => {
            cuda::install();
            GPU_HANDLERS
        }
        other => return Err(PyValueError::new_err(format!("unknown platform {other:?}"))),
    };
    table
        .iter()
        .map(|&(name, handler)| {
            // PyO3's PyCapsule::new would store a pointer to a heap box; XLA needs the
            // function pointer itself as the capsule's pointer.
            // SAFETY: a valid function pointer and a static NUL-terminated name.
            let capsule = unsafe {
                let raw = pyo3::ffi::PyCapsule_New(
                    handler as *mut c_void,
                    c"xla._CUSTOM_CALL_TARGET".as_ptr(),
                    None,
                );
                Bound::from_owned_ptr_or_err(py, raw)?.cast_into::<PyCapsule>()?
            };
            Ok((name, capsule))
        })
        .collect()
}

/// Runs `f` on the installed library without holding the GIL (a collective waits for the
/// other ranks); a failure is named after `op`, the function called, with whatever failed
/// inside it (e.g. `MPI_Comm_rank`) as its step.
fn on_library<T: Send>(
    py: Python<'_>,
    op: &'static str,
    f: impl FnOnce(&dyn Library) -> jaxmpi_core::Result<T> + Send,
) -> PyResult<T> {
    let library = installed()?;
    py.detach(|| f(library)).map_err(|err| to_py(err.in_op(op)))
}

/// The dtype names jaxmpi can move (numpy spelling).
#[pyfunction]
fn dtypes() -> Vec<&'static str> {
    Dtype::ALL.iter().map(|d| d.name()).collect()
}

/// The predefined reductions, in the order the handlers number them.
#[pyfunction]
fn reduce_ops() -> Vec<&'static str> {
    ReduceOp::PREDEFINED.iter().map(|op| op.name()).collect()
}

/// Whether predefined op `name` is defined on `dtype` (MPI's rules, plus jaxmpi's own
/// float16/bfloat16 reductions).
#[pyfunction]
fn op_supports(name: &str, dtype: &str) -> PyResult<bool> {
    let op = ReduceOp::from_name(name)
        .ok_or_else(|| PyValueError::new_err(format!("unknown op {name}")))?;
    let dtype = Dtype::from_name(dtype)
        .ok_or_else(|| PyValueError::new_err(format!("unknown dtype {dtype}")))?;
    Ok(op.supports(dtype))
}

/// Every op's declaration (core/src/xla/handlers/mod.rs), from which the Python lowerings
/// derive their attributes: {name: {"operands": [...], "results": [...], "attrs": [(name,
/// kind), ...], "started": name of its started form or "", "starts": "", "host_only": why
/// it cannot run on GPU buffers or ""}}, and for each started form its own entry: {...,
/// "results": ["request", ...], "attrs": the op's and ("results", "int"), "started": "",
/// "starts": the op's name, "host_only": why no started form runs there}. A `reduce_op`
/// attribute is followed by its `user_op` address.
#[pyfunction]
fn signatures(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let all = PyDict::new(py);
    for signature in SIGNATURES {
        let mut attrs = Vec::new();
        for attr in signature.attrs {
            attrs.push((attr.name, attr.kind.name()));
            if attr.kind == Kind::ReduceOp {
                attrs.push((USER_OP, Kind::Address.name()));
            }
        }
        let entry = PyDict::new(py);
        entry.set_item("operands", signature.operands)?;
        entry.set_item("results", signature.results)?;
        entry.set_item("attrs", attrs.clone())?;
        entry.set_item("started", signature.started)?;
        entry.set_item("starts", "")?;
        entry.set_item("host_only", signature.host_only)?;
        all.set_item(signature.name, entry)?;
        if signature.started.is_empty() {
            continue;
        }
        let started = PyDict::new(py);
        let results: Vec<&str> = ["request"]
            .into_iter()
            .chain(signature.results.iter().copied())
            .collect();
        attrs.push((STARTED_RESULTS, Kind::Int.name()));
        started.set_item("operands", signature.operands)?;
        started.set_item("results", results)?;
        started.set_item("attrs", attrs)?;
        started.set_item("started", "")?;
        started.set_item("starts", signature.name)?;
        started.set_item("host_only", NON_BLOCKING)?;
        all.set_item(signature.started, started)?;
    }
    Ok(all)
}

/// The portable encodings of "any source", "no peer", "any tag" and "a user reduction"
/// the handlers read (the predefined reductions are numbered as `reduce_ops()` lists them).
#[pyfunction]
fn constants(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let dict = PyDict::new(py);
    dict.set_item("PEER_ANY", PEER_ANY)?;
    dict.set_item("PEER_NULL", PEER_NULL)?;
    dict.set_item("TAG_ANY", TAG_ANY)?;
    dict.set_item("OP_USER", OP_USER)?;
    Ok(dict)
}

/// The public ops built on `ragged_alltoallv`, in the order of its `origin` attribute.
#[pyfunction]
fn ragged_origins() -> Vec<&'static str> {
    ragged::ORIGINS.to_vec()
}

/// Makes later started collectives complete at their start, or start non-blocking, whatever
/// the progress mode; None: as it says (every rank alike; tests run both ways).
#[pyfunction]
#[pyo3(signature = (at_start))]
fn set_collectives_at_start(at_start: Option<bool>) {
    progress::set_collectives_at_start(at_start);
}

/// Whether started collectives complete at their start (and `after` places no work):
/// progress mode "at-start", or as `set_collectives_at_start` set.
#[pyfunction]
fn collectives_at_start() -> PyResult<bool> {
    progress::collectives_at_start().map_err(to_py)
}

/// The CPU cores each rank of this node may use (whether a progress thread has one to
/// spare), and whether every rank of the job runs on this host.
#[pyfunction]
fn set_cores_per_rank(cores: f64, one_host: bool) {
    progress::set_cores_per_rank(cores);
    progress::set_one_host(one_host);
}

/// Waits for a request started outside jit (`value`: the bits of its request value) whose
/// transfer uses the buffer at `buffer`.
#[pyfunction]
fn wait_request(py: Python<'_>, value: [u32; 2], buffer: usize) -> PyResult<()> {
    py.detach(|| nonblocking::wait_eager(value, buffer))
        .map_err(to_py)
}

/// At interpreter exit: stops the progress agent and gives up the requests nobody waited
/// for (returned, described, for a warning), then finalizes MPI if jaxmpi initialized it.
#[pyfunction]
fn finalize(py: Python<'_>) -> PyResult<Vec<String>> {
    match library() {
        Ok(library) => {
            let abandoned = py.detach(|| in_flight::shut_down(library));
            cuda::release();
            py.detach(|| library.finalize()).map_err(to_py)?;
            Ok(abandoned)
        }
        Err(_) => Ok(Vec::new()),
    }
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("MPIError", m.py().get_type::<MPIError>())?;
    // The crate's version is the wheel's (pyproject.toml takes it from Cargo.toml).
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_function(wrap_pyfunction!(set_error_type, m)?)?;
    comms::register(m)?;
    gpu::register(m)?;
    profile::register(m)?;
    m.add_function(wrap_pyfunction!(rewrite_hlo, m)?)?;
    m.add_function(wrap_pyfunction!(set_device_owners, m)?)?;
    m.add_function(wrap_pyfunction!(mesh_comm, m)?)?;
    m.add_function(wrap_pyfunction!(handle_id, m)?)?;
    m.add_function(wrap_pyfunction!(hlo_targets, m)?)?;
    m.add_function(wrap_pyfunction!(hlo_revision, m)?)?;
    m.add_function(wrap_pyfunction!(mesh_reductions, m)?)?;
    m.add_function(wrap_pyfunction!(device_communicators, m)?)?;
    m.add_function(wrap_pyfunction!(init, m)?)?;
    m.add_function(wrap_pyfunction!(info, m)?)?;
    m.add_function(wrap_pyfunction!(xla_plugin_loaded, m)?)?;
    m.add_function(wrap_pyfunction!(handlers, m)?)?;
    m.add_function(wrap_pyfunction!(finalize, m)?)?;
    m.add_function(wrap_pyfunction!(wait_request, m)?)?;
    m.add_function(wrap_pyfunction!(set_cores_per_rank, m)?)?;
    m.add_function(wrap_pyfunction!(set_collectives_at_start, m)?)?;
    m.add_function(wrap_pyfunction!(collectives_at_start, m)?)?;
    m.add_function(wrap_pyfunction!(keep_failures, m)?)?;
    m.add_function(wrap_pyfunction!(take_failure, m)?)?;
    m.add_function(wrap_pyfunction!(checked_mode, m)?)?;
    m.add_function(wrap_pyfunction!(set_checked_mode, m)?)?;
    m.add_function(wrap_pyfunction!(start_verdicts, m)?)?;
    m.add_function(wrap_pyfunction!(set_start_verdicts, m)?)?;
    m.add_function(wrap_pyfunction!(discard_failure, m)?)?;
    m.add_function(wrap_pyfunction!(dtypes, m)?)?;
    m.add_function(wrap_pyfunction!(reduce_ops, m)?)?;
    m.add_function(wrap_pyfunction!(op_supports, m)?)?;
    m.add_function(wrap_pyfunction!(signatures, m)?)?;
    m.add_function(wrap_pyfunction!(constants, m)?)?;
    m.add_function(wrap_pyfunction!(ragged_origins, m)?)?;
    Ok(())
}
