//! Safe reads of this process's own memory at addresses that may be invalid.

/// Copies `out.len()` words from `address` into `out`; false if any byte is unmapped.
/// The kernel does the access, so a bad address yields EFAULT instead of SIGSEGV.
pub fn read_own_memory(address: usize, out: &mut [usize]) -> bool {
    let len = std::mem::size_of_val(out);
    let local = libc::iovec {
        iov_base: out.as_mut_ptr().cast(),
        iov_len: len,
    };
    let remote = libc::iovec {
        iov_base: address as *mut libc::c_void,
        iov_len: len,
    };
    // SAFETY: `local` describes `out`, which we own mutably; `remote` is only read by the
    // kernel on our behalf, which checks it.
    let copied = unsafe { libc::process_vm_readv(libc::getpid(), &local, 1, &remote, 1, 0) };
    copied == len as isize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_mapped_memory_and_refuses_unmapped() {
        let value = [0xdead_beef_usize, 42];
        let mut out = [0usize; 2];
        assert!(read_own_memory(value.as_ptr() as usize, &mut out));
        assert_eq!(out, value);
        assert!(!read_own_memory(8, &mut out));
    }
}
