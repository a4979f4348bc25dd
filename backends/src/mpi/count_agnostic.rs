//! The count-agnostic MPI functions the ops call (see `counts.rs`): each takes 64-bit
//! counts and calls the classic function or its MPI-4 `_c` twin, as `width` decides, and
//! names the one it called in its error (`MPI_Sendrecv_replace_c`, ...).

use std::ffi::{c_int, c_void};

use jaxmpi_core::{Blocks, Broadcast, Dtype, Result};

use super::abi::{Abi, RawStatus};
use super::counts::{Typed, Width};
use super::functions::{Aint, Count};
use super::library::MpiLibrary;
use super::starting;

/// Which way the equal-block collectives move data (their MPI functions share prototypes).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Direction {
    /// Every rank's block to the root (gather) or to everyone (allgather).
    Gather,
    /// The root's blocks to every rank (scatter), or everyone's to everyone (alltoall).
    Scatter,
}

/// sendrecv's peers and tags as MPI integers.
pub(super) struct RawEnvelope {
    pub dest: c_int,
    pub sendtag: c_int,
    pub source: c_int,
    pub recvtag: c_int,
}

/// A count the width check has shown to fit an `int`.
fn int(count: Count) -> c_int {
    count as c_int
}

fn ints(values: &[usize]) -> Vec<c_int> {
    values.iter().map(|&v| v as c_int).collect()
}

/// One block list as the `_c` functions take it: counts and displacements.
fn large(blocks: &Blocks) -> (Vec<Count>, Vec<Aint>) {
    let counts = blocks.counts.iter().map(|&c| c as Count).collect();
    (counts, blocks.displs.iter().map(|&d| d as Aint).collect())
}

// The count-agnostic MPI functions. Buffers are (pointer, `Typed`); the rooted and
// all-to-all collectives send and receive blocks of one `Typed` each.
//
// SAFETY (every call below): the caller's pointers are valid for what `Typed` and the
// block lists describe (they come from `Buf`/`BufMut`, checked by the op); the width check
// has shown every count passed as `int` to fit; status pointers are whole `RawStatus`es.
impl<A: Abi> MpiLibrary<A> {
    pub(super) fn mpi_bcast(
        &self,
        buf: &Broadcast,
        t: &Typed<A>,
        root: c_int,
        comm: A::Handle,
    ) -> Result<()> {
        let p: *mut c_void = match buf {
            // SAFETY: MPI_Bcast only reads the buffer at the root (MPI 4.1, 6.4): the
            // read-only root buffer is never written through this pointer.
            Broadcast::Root(b) => b.ptr().cast_mut().cast(),
            Broadcast::Receiver(b) | Broadcast::InPlace(b) => b.ptr().cast(),
        };
        let (n, dt) = (t.count, t.datatype);
        let (f, rc) = match self.width(&[n as usize])? {
            Width::Int => {
                let names = ("MPI_Bcast", "MPI_Ibcast");
                return self.call_or_start(names, None, |request| match request {
                    // SAFETY: as the note above the impl says: valid buffers, counts that fit.
                    None => unsafe { (self.fns.MPI_Bcast)(p, int(n), dt, root, comm) },
                    // SAFETY: as above; `r` is one writable request handle.
                    Some(r) => unsafe { (self.fns.MPI_Ibcast)(p, int(n), dt, root, comm, r) },
                });
            }
            // SAFETY: as the note above the impl says: valid buffers, counts that fit.
            Width::Large(l) => ("MPI_Bcast_c", unsafe {
                (l.MPI_Bcast_c)(p, n, dt, root, comm)
            }),
        };
        self.check(f, rc)
    }

    /// gather or scatter (`root: Some`), allgather or alltoall (`None`): one block of `t`
    /// per rank on the side that holds all of them.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn mpi_equal_blocks(
        &self,
        direction: Direction,
        s: *const c_void,
        r: *mut c_void,
        t: &Typed<A>,
        root: Option<c_int>,
        comm: A::Handle,
    ) -> Result<()> {
        let (n, dt) = (t.count, t.datatype);
        let gather = direction == Direction::Gather;
        let (f, rc) = match (self.width(&[n as usize])?, root) {
            (Width::Int, Some(root)) => {
                let (names, fp, ifp) = if gather {
                    let names = ("MPI_Gather", "MPI_Igather");
                    (names, self.fns.MPI_Gather, self.fns.MPI_Igather)
                } else {
                    let names = ("MPI_Scatter", "MPI_Iscatter");
                    (names, self.fns.MPI_Scatter, self.fns.MPI_Iscatter)
                };
                let n = int(n);
                return self.call_or_start(names, None, |request| match request {
                    // SAFETY: as the note above the impl says: valid buffers, counts that fit.
                    None => unsafe { fp(s, n, dt, r, n, dt, root, comm) },
                    // SAFETY: as above; `q` is one writable request handle.
                    Some(q) => unsafe { ifp(s, n, dt, r, n, dt, root, comm, q) },
                });
            }
            (Width::Large(l), Some(root)) => {
                let (f, fp) = if gather {
                    ("MPI_Gather_c", l.MPI_Gather_c)
                } else {
                    ("MPI_Scatter_c", l.MPI_Scatter_c)
                };
                // SAFETY: as the note above the impl says: valid buffers, counts that fit.
                (f, unsafe { fp(s, n, dt, r, n, dt, root, comm) })
            }
            (Width::Int, None) => {
                let (names, fp, ifp) = if gather {
                    let names = ("MPI_Allgather", "MPI_Iallgather");
                    (names, self.fns.MPI_Allgather, self.fns.MPI_Iallgather)
                } else {
                    let names = ("MPI_Alltoall", "MPI_Ialltoall");
                    (names, self.fns.MPI_Alltoall, self.fns.MPI_Ialltoall)
                };
                let n = int(n);
                return self.call_or_start(names, None, |request| match request {
                    // SAFETY: as the note above the impl says: valid buffers, counts that fit.
                    None => unsafe { fp(s, n, dt, r, n, dt, comm) },
                    // SAFETY: as above; `q` is one writable request handle.
                    Some(q) => unsafe { ifp(s, n, dt, r, n, dt, comm, q) },
                });
            }
            (Width::Large(l), None) => {
                let (f, fp) = if gather {
                    ("MPI_Allgather_c", l.MPI_Allgather_c)
                } else {
                    ("MPI_Alltoall_c", l.MPI_Alltoall_c)
                };
                // SAFETY: as the note above the impl says: valid buffers, counts that fit.
                (f, unsafe { fp(s, n, dt, r, n, dt, comm) })
            }
        };
        self.check(f, rc)
    }

    /// gatherv (`root: Some`) and allgatherv (`None`): `t` is this rank's block, `blocks`
    /// the receive buffer's (ignored away from the root), in elements of `dt`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn mpi_gatherv(
        &self,
        s: *const c_void,
        t: &Typed<A>,
        r: *mut c_void,
        blocks: &Blocks,
        dt: A::Handle,
        root: Option<c_int>,
        comm: A::Handle,
    ) -> Result<()> {
        let all: Vec<usize> = [blocks.counts, blocks.displs].concat();
        let (n, st) = (t.count, t.datatype);
        let (f, rc) = match self.width(&[&all[..], &[n as usize]].concat())? {
            Width::Int => {
                let (counts, displs) = (ints(blocks.counts), ints(blocks.displs));
                let (c, d, n) = (counts.as_ptr(), displs.as_ptr(), int(n));
                let called = match root {
                    Some(root) => {
                        let names = ("MPI_Gatherv", "MPI_Igatherv");
                        let (fp, ifp) = (self.fns.MPI_Gatherv, self.fns.MPI_Igatherv);
                        self.call_or_start(names, None, |request| match request {
                            // SAFETY: as the note above the impl says.
                            None => unsafe { fp(s, n, st, r, c, d, dt, root, comm) },
                            // SAFETY: as above; `q` is one writable request handle.
                            Some(q) => unsafe { ifp(s, n, st, r, c, d, dt, root, comm, q) },
                        })
                    }
                    None => {
                        let names = ("MPI_Allgatherv", "MPI_Iallgatherv");
                        let (fp, ifp) = (self.fns.MPI_Allgatherv, self.fns.MPI_Iallgatherv);
                        self.call_or_start(names, None, |request| match request {
                            // SAFETY: as the note above the impl says.
                            None => unsafe { fp(s, n, st, r, c, d, dt, comm) },
                            // SAFETY: as above; `q` is one writable request handle.
                            Some(q) => unsafe { ifp(s, n, st, r, c, d, dt, comm, q) },
                        })
                    }
                };
                // A started request reads the counts until it completes.
                starting::keep((counts, displs));
                return called;
            }
            Width::Large(l) => {
                let (c, d) = large(blocks);
                let (c, d) = (c.as_ptr(), d.as_ptr());
                match root {
                    // SAFETY: as the note above the impl says: valid buffers, counts that fit.
                    Some(root) => ("MPI_Gatherv_c", unsafe {
                        (l.MPI_Gatherv_c)(s, n, st, r, c, d, dt, root, comm)
                    }),
                    // SAFETY: as the note above the impl says: valid buffers, counts that fit.
                    None => ("MPI_Allgatherv_c", unsafe {
                        (l.MPI_Allgatherv_c)(s, n, st, r, c, d, dt, comm)
                    }),
                }
            }
        };
        self.check(f, rc)
    }

    /// scatterv: `blocks` is the send buffer's (ignored away from the root), `t` this
    /// rank's block.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn mpi_scatterv(
        &self,
        s: *const c_void,
        blocks: &Blocks,
        dt: A::Handle,
        r: *mut c_void,
        t: &Typed<A>,
        root: c_int,
        comm: A::Handle,
    ) -> Result<()> {
        let all: Vec<usize> = [blocks.counts, blocks.displs, &[t.count as usize]].concat();
        let (n, rt) = (t.count, t.datatype);
        let (f, rc) = match self.width(&all)? {
            Width::Int => {
                let (counts, displs) = (ints(blocks.counts), ints(blocks.displs));
                let (c, d, n) = (counts.as_ptr(), displs.as_ptr(), int(n));
                let names = ("MPI_Scatterv", "MPI_Iscatterv");
                let (fp, ifp) = (self.fns.MPI_Scatterv, self.fns.MPI_Iscatterv);
                let called = self.call_or_start(names, None, |request| match request {
                    // SAFETY: as the note above the impl says: valid buffers, counts that fit.
                    None => unsafe { fp(s, c, d, dt, r, n, rt, root, comm) },
                    // SAFETY: as above; `q` is one writable request handle.
                    Some(q) => unsafe { ifp(s, c, d, dt, r, n, rt, root, comm, q) },
                });
                // A started request reads the counts until it completes.
                starting::keep((counts, displs));
                return called;
            }
            Width::Large(l) => {
                let (c, d) = large(blocks);
                let (c, d) = (c.as_ptr(), d.as_ptr());
                // SAFETY: as the note above the impl says: valid buffers, counts that fit.
                ("MPI_Scatterv_c", unsafe {
                    (l.MPI_Scatterv_c)(s, c, d, dt, r, n, rt, root, comm)
                })
            }
        };
        self.check(f, rc)
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn mpi_alltoallv(
        &self,
        s: *const c_void,
        sent: &Blocks,
        r: *mut c_void,
        received: &Blocks,
        dt: A::Handle,
        comm: A::Handle,
    ) -> Result<()> {
        let all = [sent.counts, sent.displs, received.counts, received.displs].concat();
        let (f, rc) = match self.width(&all)? {
            Width::Int => {
                let arrays = [sent.counts, sent.displs, received.counts, received.displs].map(ints);
                let [sc, sd, rc, rd] = [0, 1, 2, 3].map(|i| arrays[i].as_ptr());
                let names = ("MPI_Alltoallv", "MPI_Ialltoallv");
                let (fp, ifp) = (self.fns.MPI_Alltoallv, self.fns.MPI_Ialltoallv);
                let called = self.call_or_start(names, None, |request| match request {
                    // SAFETY: as the note above the impl says: valid buffers, counts that fit.
                    None => unsafe { fp(s, sc, sd, dt, r, rc, rd, dt, comm) },
                    // SAFETY: as above; `q` is one writable request handle.
                    Some(q) => unsafe { ifp(s, sc, sd, dt, r, rc, rd, dt, comm, q) },
                });
                // A started request reads the counts until it completes.
                starting::keep(arrays);
                return called;
            }
            Width::Large(l) => {
                let ((sc, sd), (rc, rd)) = (large(sent), large(received));
                let (sc, sd, rc, rd) = (sc.as_ptr(), sd.as_ptr(), rc.as_ptr(), rd.as_ptr());
                // SAFETY: as the note above the impl says: valid buffers, counts that fit.
                ("MPI_Alltoallv_c", unsafe {
                    (l.MPI_Alltoallv_c)(s, sc, sd, dt, r, rc, rd, dt, comm)
                })
            }
        };
        self.check(f, rc)
    }

    pub(super) fn mpi_send(
        &self,
        p: *const c_void,
        t: &Typed<A>,
        dest: c_int,
        tag: c_int,
        comm: A::Handle,
    ) -> Result<()> {
        let (f, rc) = match self.width(&[t.count as usize])? {
            Width::Int => {
                let (n, dt) = (int(t.count), t.datatype);
                return self.call_or_start(("MPI_Send", "MPI_Isend"), None, |request| {
                    match request {
                        // SAFETY: as the note above the impl says: valid buffers, counts that fit.
                        None => unsafe { (self.fns.MPI_Send)(p, n, dt, dest, tag, comm) },
                        // SAFETY: as above; `q` is one writable request handle.
                        Some(q) => unsafe { (self.fns.MPI_Isend)(p, n, dt, dest, tag, comm, q) },
                    }
                });
            }
            // SAFETY: as the note above the impl says: valid buffers, counts that fit.
            Width::Large(l) => ("MPI_Send_c", unsafe {
                (l.MPI_Send_c)(p, t.count, t.datatype, dest, tag, comm)
            }),
        };
        self.check(f, rc)
    }

    #[allow(clippy::too_many_arguments)]
    /// `receives`: the dtype `t` counts elements of, for a started receive's status. A
    /// started receive leaves `status` as it was: its request's completion fills one.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn mpi_recv(
        &self,
        p: *mut c_void,
        t: &Typed<A>,
        source: c_int,
        tag: c_int,
        comm: A::Handle,
        status: &mut RawStatus,
        receives: Dtype,
    ) -> Result<()> {
        let st = status.as_mut_ptr();
        let (f, rc) = match self.width(&[t.count as usize])? {
            Width::Int => {
                let (n, dt) = (int(t.count), t.datatype);
                let names = ("MPI_Recv", "MPI_Irecv");
                return self.call_or_start(names, Some(receives), |request| match request {
                    // SAFETY: as the note above the impl says: valid buffers, counts that fit.
                    None => unsafe { (self.fns.MPI_Recv)(p, n, dt, source, tag, comm, st) },
                    // SAFETY: as above; `q` is one writable request handle.
                    Some(q) => unsafe { (self.fns.MPI_Irecv)(p, n, dt, source, tag, comm, q) },
                });
            }
            // SAFETY: as the note above the impl says: valid buffers, counts that fit.
            Width::Large(l) => ("MPI_Recv_c", unsafe {
                (l.MPI_Recv_c)(p, t.count, t.datatype, source, tag, comm, st)
            }),
        };
        self.check(f, rc)
    }

    /// MPI_Isend: the request it starts is written to `request`.
    pub(super) fn mpi_isend(
        &self,
        p: *const c_void,
        t: &Typed<A>,
        (dest, tag): (c_int, c_int),
        comm: A::Handle,
        request: &mut A::Handle,
    ) -> Result<()> {
        let (f, rc) = match self.width(&[t.count as usize])? {
            // SAFETY: as the note above the impl says; `request` is one writable handle.
            Width::Int => ("MPI_Isend", unsafe {
                (self.fns.MPI_Isend)(p, int(t.count), t.datatype, dest, tag, comm, request)
            }),
            // SAFETY: as the note above the impl says; `request` is one writable handle.
            Width::Large(l) => ("MPI_Isend_c", unsafe {
                (l.MPI_Isend_c)(p, t.count, t.datatype, dest, tag, comm, request)
            }),
        };
        self.check(f, rc)
    }

    /// MPI_Irecv: the request it starts is written to `request`.
    pub(super) fn mpi_irecv(
        &self,
        p: *mut c_void,
        t: &Typed<A>,
        (source, tag): (c_int, c_int),
        comm: A::Handle,
        request: &mut A::Handle,
    ) -> Result<()> {
        let (f, rc) = match self.width(&[t.count as usize])? {
            // SAFETY: as the note above the impl says; `request` is one writable handle.
            Width::Int => ("MPI_Irecv", unsafe {
                (self.fns.MPI_Irecv)(p, int(t.count), t.datatype, source, tag, comm, request)
            }),
            // SAFETY: as the note above the impl says; `request` is one writable handle.
            Width::Large(l) => ("MPI_Irecv_c", unsafe {
                (l.MPI_Irecv_c)(p, t.count, t.datatype, source, tag, comm, request)
            }),
        };
        self.check(f, rc)
    }

    /// MPI_Sendrecv, or MPI_Sendrecv_replace when `s` is `None` (the message to send is
    /// in `r`, as `tr` describes it).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn mpi_sendrecv(
        &self,
        s: Option<(*const c_void, &Typed<A>)>,
        r: *mut c_void,
        tr: &Typed<A>,
        envelope: RawEnvelope,
        comm: A::Handle,
        status: &mut RawStatus,
    ) -> Result<()> {
        let st = status.as_mut_ptr();
        let RawEnvelope {
            dest,
            sendtag,
            source,
            recvtag,
        } = envelope;
        let sent = s.map_or(0, |(_, ts)| ts.count as usize);
        let (rn, rt) = (tr.count, tr.datatype);
        let (f, rc) = match (self.width(&[sent, rn as usize])?, s) {
            // SAFETY: as the note above the impl says: valid buffers, counts that fit.
            (Width::Int, Some((s, ts))) => ("MPI_Sendrecv", unsafe {
                (self.fns.MPI_Sendrecv)(
                    s,
                    int(ts.count),
                    ts.datatype,
                    dest,
                    sendtag,
                    r,
                    int(rn),
                    rt,
                    source,
                    recvtag,
                    comm,
                    st,
                )
            }),
            // SAFETY: as the note above the impl says: valid buffers, counts that fit.
            (Width::Large(l), Some((s, ts))) => ("MPI_Sendrecv_c", unsafe {
                (l.MPI_Sendrecv_c)(
                    s,
                    ts.count,
                    ts.datatype,
                    dest,
                    sendtag,
                    r,
                    rn,
                    rt,
                    source,
                    recvtag,
                    comm,
                    st,
                )
            }),
            // SAFETY: as the note above the impl says: valid buffers, counts that fit.
            (Width::Int, None) => ("MPI_Sendrecv_replace", unsafe {
                (self.fns.MPI_Sendrecv_replace)(
                    r,
                    int(rn),
                    rt,
                    dest,
                    sendtag,
                    source,
                    recvtag,
                    comm,
                    st,
                )
            }),
            // SAFETY: as the note above the impl says: valid buffers, counts that fit.
            (Width::Large(l), None) => ("MPI_Sendrecv_replace_c", unsafe {
                (l.MPI_Sendrecv_replace_c)(r, rn, rt, dest, sendtag, source, recvtag, comm, st)
            }),
        };
        self.check(f, rc)
    }
}
