//! The XLA front end: what XLA calls (the FFI handlers, the call frame they read and their
//! C ABI) and what every call carries around its op body (the monitor behind
//! `JAXMPI_DEBUG`, the watchdog behind `JAXMPI_TIMEOUT`). Nothing here is seen by a
//! backend: backends implement the vocabulary at the crate's root. `plugin_calls` tracks
//! the same way the MPI calls XLA makes itself through the plug-in (XLA's MPI backend).
//! `profile` records every call of every route while a profile (`JAXMPI_PROFILE`) runs.

pub mod devices;
pub mod ffi;
pub mod frame;
pub mod handlers;
pub mod hlo;
pub mod mesh;
mod monitor;
pub mod plugin_calls;
pub mod profile;
mod watchdog;
