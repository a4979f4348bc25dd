//! What Python asks of CUDA to show it (`python -m jaxmpi info`, the GPU run's checks):
//! the driver, the GPUs it sees, and which way a GPU buffer would go. Apart from `cuda`,
//! whose runtime these describe and whose pointer attributes they read: nothing in the
//! runtime asks them.

use jaxmpi_core::{Library, Result};

use super::cuda::pointer_attributes;
use super::driver;

/// GPUs the driver sees (after CUDA_VISIBLE_DEVICES).
pub fn gpu_count() -> Result<i32> {
    let d = driver::driver()?;
    let mut count = 0;
    // SAFETY: the driver is initialized; writes one int.
    d.check("cuDeviceGetCount", unsafe {
        (d.api.cuDeviceGetCount)(&mut count)
    })?;
    Ok(count)
}

/// The driver's CUDA version (e.g. 13000 for 13.0).
pub fn driver_version() -> Result<i32> {
    let d = driver::driver()?;
    let mut version = 0;
    // SAFETY: writes one int.
    d.check("cuDriverGetVersion", unsafe {
        (d.api.cuDriverGetVersion)(&mut version)
    })?;
    Ok(version)
}

/// What this process does with a GPU buffer at `ptr` (true: GPU pointers to MPI),
/// and why: the same rule the decorators follow.
pub fn decide_for_buffer(library: &dyn Library, ptr: usize) -> Result<(bool, String)> {
    if !library.cuda_aware() {
        return Ok((false, format!("staged: {}", library.cuda_aware_reason())));
    }
    if !library.cuda_aware_checks_buffers() {
        return Ok((true, format!("direct: {}", library.cuda_aware_reason())));
    }
    let shareable = pointer_attributes(ptr)?
        .into_iter()
        .find(|(name, _)| *name == "is_legacy_cuda_ipc_capable")
        .map(|(_, value)| value)
        .expect("asked for above");
    let shareable = match shareable {
        Ok(shareable) => shareable,
        Err(err) => {
            let why = format!(
                "staged: the library supports CUDA, but the driver could not say whether \
                 legacy CUDA IPC can share this buffer ({err})"
            );
            return Ok((false, why));
        }
    };
    Ok(if shareable != 0 {
        (
            true,
            "direct: the library supports CUDA and legacy CUDA IPC can share this buffer".into(),
        )
    } else {
        (
            false,
            "staged: the library supports CUDA, but legacy CUDA IPC cannot share this buffer \
             (XLA's allocator made it with cuMemCreate or a memory pool); JAXMPI_CUDA_AWARE=1 \
             would pass it"
                .into(),
        )
    })
}

/// The driver's file and every libcuda mapped in the process (one, unless a second was
/// loaded beside XLA's).
pub fn driver_files() -> Result<(String, bool, Vec<String>)> {
    let d = driver::driver()?;
    Ok((d.path.clone(), d.already_loaded, driver::mapped_libcudas()))
}
