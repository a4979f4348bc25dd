//! `MpiLibrary<A>`: one MPI library, loaded with dlopen, driven through the function table
//! (`functions.rs`), with the family's differences supplied by `A: Abi`. This file holds
//! loading, initialization, finalization and MPI error codes; `handles.rs` converts values,
//! `impl_library.rs` implements core's `Library` and `impl_backend.rs` its `Backend` (the
//! ops in the files `mod.rs` names, over the count convention `counts.rs` picks).

use std::ffi::{c_char, c_int};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

use jaxmpi_core::{Dtype, Error, LibraryInfo, ReduceOp, Result, ThreadLevel};
use libloading::Library;

use super::abi::{Abi, Predefined};
use super::cuda_aware::{self, CudaAware, LibraryAnswer};
use super::functions::{self, Functions, LargeCountFunctions};
use super::interpose::Interposed;
use super::own_reductions;
use super::quirks::Quirks;

/// Large enough for every family's MPI_MAX_LIBRARY_VERSION_STRING and MPI_MAX_ERROR_STRING.
const STRING_BUFFER: usize = 8192;

pub struct MpiLibrary<A: Abi> {
    pub(super) lib: Library,
    pub(super) fns: Functions<A::Handle>,
    pub(super) large: Option<LargeCountFunctions<A::Handle>>,
    pub(super) pre: Predefined<A::Handle>,
    /// jaxmpi's own reductions (see `own_reductions`), created once at load.
    pub(super) own_reductions: Vec<(Dtype, ReduceOp, A::Handle)>,
    /// Bugs of this library version that the ops work around.
    pub(super) quirks: Quirks,
    /// The keyval under which a communicator keeps jaxmpi's private duplicate of it
    /// (`ring.rs`), created at the first.
    pub(super) private_duplicates: OnceLock<c_int>,
    pub(super) info: LibraryInfo,
    pub(super) thread_level: ThreadLevel,
    pub(super) initialized_here: bool,
    pub(super) finalized_here: AtomicBool,
    pub(super) world_rank: i32,
    pub(super) cuda_aware: CudaAware,
}

pub(crate) fn c_string(buffer: &[c_char], len: c_int) -> String {
    let len = usize::try_from(len).unwrap_or(0).min(buffer.len());
    let bytes: Vec<u8> = buffer[..len].iter().map(|&c| c as u8).collect();
    String::from_utf8_lossy(&bytes)
        .trim_end_matches('\0')
        .trim()
        .to_string()
}

impl<A: Abi> MpiLibrary<A> {
    /// Takes over an opened library: resolves every function, checks the MPI version,
    /// initializes MPI unless someone already did, and prepares jaxmpi's own ops.
    pub fn load(lib: Library, path: PathBuf, chosen_by: String) -> Result<Self> {
        let mut interposed = Interposed::new();
        let fns = Functions::<A::Handle>::load(&lib, &mut interposed).map_err(|missing| {
            Error::library(
                "load MPI",
                format!(
                    "{} is not a usable MPI library: it has no {missing}",
                    path.display()
                ),
            )
        })?;
        Self::with_functions(lib, fns, path, chosen_by, Some(interposed))
    }

    /// As `load`, with the function table already filled (from dlsym or by the linker);
    /// `lib` serves the optional lookups. `interposed`: the functions a profiling tool took
    /// over (`interpose.rs`) so far; None where the linker bound them.
    pub(crate) fn with_functions(
        lib: Library,
        fns: Functions<A::Handle>,
        path: PathBuf,
        chosen_by: String,
        mut interposed: Option<Interposed>,
    ) -> Result<Self> {
        let step = "load MPI";
        let shown = path.display().to_string();
        let pre =
            A::predefined(&lib).map_err(|why| Error::library(step, format!("{shown}: {why}")))?;
        let mut large_interposed = Interposed::new();
        let large = LargeCountFunctions::load(&lib, &mut large_interposed).ok();
        if let (Some(interposed), Some(_)) = (interposed.as_mut(), &large) {
            interposed.append(&mut large_interposed);
        }

        let (mut major, mut minor) = (0, 0);
        // SAFETY: MPI_Get_version may be called before MPI_Init; it writes two ints.
        unsafe { (fns.MPI_Get_version)(&mut major, &mut minor) };
        if major < 3 {
            return Err(Error::library(
                step,
                format!("{shown} implements MPI {major}.{minor}; jaxmpi needs MPI 3.0 or newer"),
            ));
        }
        let mut buffer = vec![0 as c_char; STRING_BUFFER];
        let mut len = 0;
        // SAFETY: callable before MPI_Init; the buffer is larger than any family's maximum.
        unsafe { (fns.MPI_Get_library_version)(buffer.as_mut_ptr(), &mut len) };
        let version_string = c_string(&buffer, len);

        let mut library = MpiLibrary {
            lib,
            fns,
            large,
            pre,
            own_reductions: Vec::new(),
            quirks: Quirks::default(),
            private_duplicates: OnceLock::new(),
            info: LibraryInfo {
                family: A::FAMILY,
                path,
                version_string,
                standard_version: (major, minor),
                chosen_by,
                any_source: A::ANY_SOURCE,
                proc_null: A::PROC_NULL,
                any_tag: A::ANY_TAG,
                interposed,
            },
            thread_level: ThreadLevel::Single,
            initialized_here: false,
            finalized_here: AtomicBool::new(false),
            world_rank: -1,
            cuda_aware: CudaAware {
                aware: false,
                checks_buffers: false,
                reason: "not decided before MPI_Init".into(),
            },
        };
        library.initialize()?;
        Ok(library)
    }

    fn initialize(&mut self) -> Result<()> {
        let step = "initialize MPI";
        let (mut initialized, mut finalized) = (0, 0);
        // SAFETY: both may be called at any time and write one int.
        unsafe {
            (self.fns.MPI_Finalized)(&mut finalized);
            (self.fns.MPI_Initialized)(&mut initialized);
        }
        if finalized != 0 {
            return Err(Error::library(
                step,
                "MPI was already finalized in this process; it cannot be used again",
            ));
        }
        let mut provided = 0;
        if initialized == 0 {
            let multiple = A::THREAD_LEVELS[3];
            // SAFETY: MPI is not initialized; NULL argc/argv is allowed.
            let rc = unsafe {
                (self.fns.MPI_Init_thread)(
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    multiple,
                    &mut provided,
                )
            };
            if rc != 0 {
                return Err(Error::mpi(
                    step,
                    rc,
                    format!("MPI_Init_thread returned {rc}"),
                ));
            }
            self.initialized_here = true;
            // As mpi4py does: errors on the predefined communicators (and on handles
            // that are no communicator at all) come back as codes instead of aborting.
            for comm in [self.pre.comm_world, self.pre.comm_self] {
                // SAFETY: predefined communicators of an initialized MPI.
                let rc =
                    unsafe { (self.fns.MPI_Comm_set_errhandler)(comm, self.pre.errors_return) };
                self.check(step, rc)?;
            }
        } else {
            // SAFETY: MPI is initialized; writes one int.
            unsafe { (self.fns.MPI_Query_thread)(&mut provided) };
        }
        self.thread_level = match A::THREAD_LEVELS.iter().position(|&l| l == provided) {
            Some(0) => ThreadLevel::Single,
            Some(1) => ThreadLevel::Funneled,
            Some(2) => ThreadLevel::Serialized,
            Some(_) => ThreadLevel::Multiple,
            None => {
                return Err(Error::library(
                    step,
                    format!("MPI reported unknown thread level {provided}"),
                ))
            }
        };
        if self.thread_level < ThreadLevel::Serialized {
            return Err(Error::library(
                step,
                format!(
                    "MPI was initialized with {}, but XLA calls MPI from its own threads: \
                     initialize MPI with MPI_THREAD_MULTIPLE (mpi4py's default) or let jaxmpi do it",
                    self.thread_level.name()
                ),
            ));
        }
        self.world_rank = self.comm_rank_raw(self.pre.comm_world)?;
        self.check_datatype_table()?;
        self.quirks = Quirks::of(&self.info);
        for (dtype, op) in own_reductions::needed(self.quirks.unsigned_min_max_as_signed) {
            let Some(callback) = own_reductions::callback(dtype, op) else {
                continue;
            };
            let mut handle = self.pre.op_null;
            // SAFETY: a valid callback and an out-pointer to one handle.
            let rc = unsafe { (self.fns.MPI_Op_create)(callback, 1, &mut handle) };
            self.check(step, rc)?;
            self.own_reductions.push((dtype, op, handle));
        }
        let setting = std::env::var(cuda_aware::SETTING).ok();
        let hints: Vec<(&str, String)> = A::CUDA_HINTS
            .iter()
            .filter_map(|&name| Some((name, std::env::var(name).ok()?)))
            .collect();
        let hints: Vec<(&str, &str)> = hints.iter().map(|(n, v)| (*n, v.as_str())).collect();
        self.cuda_aware =
            cuda_aware::decide(setting.as_deref(), self.query_cuda_support(), &hints)?;
        Ok(())
    }

    fn query_cuda_support(&self) -> LibraryAnswer {
        type GpuQuery = unsafe extern "C" fn(c_int, *mut c_int) -> c_int;
        type CudaQuery = unsafe extern "C" fn() -> c_int;
        const MPIX_GPU_SUPPORT_CUDA: c_int = 0;
        // SAFETY: the prototypes MPICH (>= 4) and Open MPI document for these extensions.
        unsafe {
            if let Some(query) =
                functions::optional::<GpuQuery>(&self.lib, "MPIX_GPU_query_support")
            {
                let mut supported = 0;
                let rc = query(MPIX_GPU_SUPPORT_CUDA, &mut supported);
                return LibraryAnswer::Answered {
                    query: "MPIX_GPU_query_support",
                    supported: rc == 0 && supported != 0,
                };
            }
            match functions::optional::<CudaQuery>(&self.lib, "MPIX_Query_cuda_support") {
                Some(query) => LibraryAnswer::Answered {
                    query: "MPIX_Query_cuda_support",
                    supported: query() != 0,
                },
                None => LibraryAnswer::NoQuery,
            }
        }
    }

    pub(super) fn finalize_if_owned(&self) -> Result<()> {
        if !self.initialized_here || self.finalized_here.swap(true, Ordering::SeqCst) {
            return Ok(());
        }
        let mut finalized = 0;
        // SAFETY: may be called at any time.
        unsafe { (self.fns.MPI_Finalized)(&mut finalized) };
        if finalized != 0 {
            return Ok(());
        }
        for &(_, _, mut op) in &self.own_reductions {
            // SAFETY: ops this library created and nothing uses any more.
            unsafe { (self.fns.MPI_Op_free)(&mut op) };
        }
        // SAFETY: MPI is initialized, not finalized, and was initialized by us.
        let rc = unsafe { (self.fns.MPI_Finalize)() };
        self.check("finalize MPI", rc)
    }

    /// Turns an MPI return code into an error carrying the class and the library's text.
    pub(super) fn check(&self, op: &'static str, rc: c_int) -> Result<()> {
        if rc == 0 {
            return Ok(());
        }
        let mut class = rc;
        let mut buffer = vec![0 as c_char; STRING_BUFFER];
        let mut len = 0;
        // SAFETY: both accept any error code; the buffer exceeds MPI_MAX_ERROR_STRING.
        unsafe {
            (self.fns.MPI_Error_class)(rc, &mut class);
            (self.fns.MPI_Error_string)(rc, buffer.as_mut_ptr(), &mut len);
        }
        Err(Error::mpi(
            op,
            class,
            format!("rank {}: {}", self.world_rank, c_string(&buffer, len)),
        ))
    }

    /// Every predefined datatype must have its dtype's size: a wrong table entry would
    /// corrupt memory, so a library that disagrees is refused at load.
    fn check_datatype_table(&self) -> Result<()> {
        for dtype in Dtype::ALL {
            let datatype = self.pre.datatype(dtype);
            let size = self.element_size(datatype)?;
            if size != dtype.size() {
                return Err(Error::library(
                    "load MPI",
                    format!(
                        "{}: the {} datatype for {dtype} ({}) has {size} bytes, not {}",
                        self.info.path.display(),
                        A::FAMILY,
                        self.name_of(datatype),
                        dtype.size()
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// `MPI_Get_library_version` text, whitespace-normalized, for one-line summaries.
pub fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}
