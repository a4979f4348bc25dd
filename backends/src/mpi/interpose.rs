//! Which definition of an MPI function jaxmpi calls: the MPI library's own, or that of a
//! profiling tool (mpiP, Score-P, TAU, ...) loaded ahead of it. Decided here, once per
//! function, when the library is loaded; every function table (`functions.rs`) and every
//! optional function takes its pointers from `definition`, so every route (the ops and their
//! started forms, MeshComm, the HLO pass, XLA's MPI collectives through the plug-in) calls
//! the same ones.
//!
//! A program linked with `-lmpi` calls `MPI_Allreduce` as the dynamic linker binds it: the
//! first definition in the process's global scope, which holds the program, then the
//! libraries of `LD_PRELOAD`, then the program's other libraries in load order, then those
//! dlopened with `RTLD_GLOBAL`, in that order. A PMPI tool puts its own `MPI_Allreduce`
//! there, ahead of the MPI library (with `LD_PRELOAD`), and calls `PMPI_Allreduce`, the
//! library's entry under its second name. jaxmpi opens MPI with dlopen: what the library's
//! own handle gives is its own `MPI_Allreduce`, past any tool. The rule, for each function
//! `MPI_X`:
//!
//! 1. `dlsym(RTLD_DEFAULT, "MPI_X")`, the definition a linked program calls, lies in an object
//!    other than the MPI library: something ahead of that library defines `MPI_X`;
//! 2. `dlsym(RTLD_DEFAULT, "PMPI_X")` lies in the MPI library jaxmpi loaded: nothing ahead of
//!    it defines `PMPI_X`. So the object of rule 1 is no MPI implementation (each defines its
//!    `PMPI_X`: MPICH, Open MPI, the MPI-5 ABI libraries, Intel MPI, and MPItrampoline,
//!    jaxlib's copy included), and its call of `PMPI_X` goes on into the MPI jaxmpi uses, not
//!    into another.
//!
//! Where both hold, jaxmpi calls that object's `MPI_X` (the tool's); otherwise the MPI
//! library's own, the very pointer it would take without this rule, so nothing changes and
//! no call costs more. Never taken: jaxlib, which exports no MPI function (its MPItrampoline
//! is linked in privately; were it exported, its `PMPI_X` would fail rule 2); mpi4py's
//! extension, which defines none and is loaded `RTLD_LOCAL` by Python, as every extension
//! module (jaxmpi's own exports no `MPI_*` either); any other MPI library (rule 2); a tool
//! that forwards with `dlsym(RTLD_NEXT)` and defines `PMPI_X` itself (rule 2); a tool loaded
//! after the MPI library, or dlopened without `RTLD_GLOBAL`, which a linked program would not
//! call either (rule 1).
//!
//! Rule 2 needs the MPI library in the global scope: `select` opens it `RTLD_GLOBAL`. The
//! `linked` backend needs none of this: the linker binds its calls, and a preloaded tool
//! interposes on them as on any program's. `tests/interposer_jobs.sh` preloads a PMPI
//! interposer and checks that it counts every call jaxmpi makes, on every route.

use std::ffi::{c_void, CStr, CString};
use std::path::PathBuf;

/// The functions a tool took over: `(MPI_X, the file that defines the MPI_X jaxmpi calls)`.
pub type Interposed = Vec<(String, PathBuf)>;

/// `name` as the process's global scope defines it (what a program linked against MPI
/// calls), or null.
fn global(name: &CStr) -> *mut c_void {
    // SAFETY: a lookup only; `name` is NUL-terminated.
    unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) }
}

/// The object an address lies in: its load address and file, by `dladdr`.
fn object_of(address: *mut c_void) -> Option<(usize, PathBuf)> {
    if address.is_null() {
        return None;
    }
    // SAFETY: dladdr fills `info` and reads nothing at `address`.
    let info = unsafe {
        let mut info: libc::Dl_info = std::mem::zeroed();
        if libc::dladdr(address, &mut info) == 0 {
            return None;
        }
        info
    };
    let file = if info.dli_fname.is_null() {
        PathBuf::new()
    } else {
        // SAFETY: dladdr's file name is a NUL-terminated string owned by the loader.
        let name = unsafe { CStr::from_ptr(info.dli_fname) };
        PathBuf::from(name.to_string_lossy().as_ref())
    };
    Some((info.dli_fbase as usize, file))
}

/// The definition of `name` jaxmpi calls, given `own`, the MPI library's (non-null): a
/// tool's, by the rule above, or `own`. A tool's is noted in `interposed`.
pub(super) fn definition(own: *mut c_void, name: &str, interposed: &mut Interposed) -> *mut c_void {
    let (Ok(cname), Ok(pname)) = (CString::new(name), CString::new(format!("P{name}"))) else {
        return own;
    };
    let linked = global(&cname);
    if linked.is_null() || linked == own {
        return own; // the common case: no tool
    }
    let Some((library, _)) = object_of(own) else {
        return own;
    };
    let Some((ahead, file)) = object_of(linked) else {
        return own;
    };
    // Rule 1: another object defines it; rule 2: PMPI_X is still the library's.
    let forwards_to_library = object_of(global(&pname)).is_some_and(|(o, _)| o == library);
    if ahead == library || !forwards_to_library {
        return own;
    }
    interposed.push((name.to_string(), file));
    linked
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_tool_the_librarys_own_definition_is_kept() {
        // libc's `getpid` stands for an MPI function here: the global scope's definition is
        // the library's own, so the rule returns the very same pointer and notes nothing.
        let own = global(c"getpid");
        assert!(!own.is_null());
        let mut interposed = Interposed::new();
        assert_eq!(definition(own, "getpid", &mut interposed), own);
        assert!(interposed.is_empty());
    }

    #[test]
    fn a_definition_in_the_library_itself_or_without_a_second_name_is_not_taken() {
        // libc stands for the MPI library, `getpid`'s address for its own definition of a
        // function whose global definition is `getppid`'s: that lies in the same object
        // (rule 1 fails), and `Pgetppid` exists nowhere (rule 2 fails): the library's own.
        let own = global(c"getpid");
        let mut interposed = Interposed::new();
        assert_eq!(definition(own, "getppid", &mut interposed), own);
        assert!(interposed.is_empty());
    }
}
