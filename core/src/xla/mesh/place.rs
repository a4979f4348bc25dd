//! Where a call's device stands: its group and its position there, found once per thread
//! for each way a call names its group, and remembered (no lock on later calls).

use std::cell::RefCell;
use std::sync::Arc;

use super::group::{self, Group, Tag};
use super::mesh_comms;
use crate::{Error, Library, Result};

/// A device's group and its position there.
pub type Place = (Arc<Group>, usize);

/// How a call names its group.
#[derive(Clone, Copy)]
pub enum Naming<'a> {
    /// XLA's collective, by its attribute (`at`: where it lies, the key a program's calls
    /// share) listing its groups: each group's size, then its devices.
    Groups { at: (usize, usize), flat: &'a [i64] },
    /// XLA's collective-permute, by its attribute of (source, target) pairs: one group of
    /// every device they name.
    Pairs { at: (usize, usize), flat: &'a [i64] },
    /// A MeshComm, by the id programs carry (`mesh_comms.rs`).
    MeshComm(i64),
}

impl Naming<'_> {
    fn key(&self) -> Key {
        match *self {
            Naming::Groups { at, .. } | Naming::Pairs { at, .. } => Key::Attribute(at),
            Naming::MeshComm(id) => Key::MeshComm(id),
        }
    }

    /// An attribute's contents: its memory may hold another program's since.
    fn contents(&self) -> &[i64] {
        match self {
            Naming::Groups { flat, .. } | Naming::Pairs { flat, .. } => flat,
            Naming::MeshComm(_) => &[],
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Key {
    Attribute((usize, usize)),
    MeshComm(i64),
}

struct Remembered {
    key: Key,
    device: i64,
    contents: Box<[i64]>,
    place: Option<Place>,
}

thread_local! {
    static PLACES: RefCell<Vec<Remembered>> = const { RefCell::new(Vec::new()) };
}

/// How many places a thread remembers (a program rarely has more than a few groups).
const REMEMBERED: usize = 64;

/// `device`'s group and position among the groups `naming` gives; None where a pair
/// names it not.
pub fn placed(library: &dyn Library, naming: Naming, device: i64) -> Result<Option<Place>> {
    let key = naming.key();
    let known = PLACES.with_borrow(|places| {
        places
            .iter()
            .find(|r| r.key == key && r.device == device && *r.contents == *naming.contents())
            .map(|r| r.place.clone())
    });
    if let Some(place) = known {
        return Ok(place);
    }
    let place = match find(naming, device)? {
        Some((members, position, tag)) => Some((group::group(library, &members, tag)?, position)),
        None => None,
    };
    PLACES.with_borrow_mut(|places| {
        if places.len() == REMEMBERED {
            places.remove(0);
        }
        places.push(Remembered {
            key,
            device,
            contents: naming.contents().into(),
            place: place.clone(),
        });
    });
    Ok(place)
}

/// `device`'s group (its devices), position and communicators' tag.
fn find(naming: Naming, device: i64) -> Result<Option<(Vec<i64>, usize, i32)>> {
    match naming {
        Naming::Groups { flat, .. } => {
            let mut at = 0;
            let mut index = 0;
            while at < flat.len() {
                let len = usize::try_from(flat[at]).unwrap_or(usize::MAX);
                let group = flat
                    .get(at + 1..(at + 1).saturating_add(len))
                    .ok_or_else(|| {
                        Error::invalid_argument("groups", "the attribute is cut short")
                    })?;
                if let Some(position) = group.iter().position(|&d| d == device) {
                    let tag = Tag::of_list(flat).of(index);
                    return Ok(Some((group.to_vec(), position, tag)));
                }
                at += 1 + len;
                index += 1;
            }
            Err(Error::invalid_argument(
                "groups",
                format!("device {device} is in none of the collective's groups"),
            ))
        }
        Naming::Pairs { flat, .. } => {
            let mut named = Vec::new();
            for &d in flat {
                if !named.contains(&d) {
                    named.push(d);
                }
            }
            let tag = Tag::of_list(flat).of(0);
            Ok(named
                .iter()
                .position(|&d| d == device)
                .map(|p| (named, p, tag)))
        }
        Naming::MeshComm(id) => {
            let groups = mesh_comms::groups(id)?;
            let all: Vec<i64> = groups.iter().flatten().copied().collect();
            let (index, position) = groups
                .iter()
                .enumerate()
                .find_map(|(i, g)| g.iter().position(|&d| d == device).map(|p| (i, p)))
                .ok_or_else(|| {
                    Error::invalid_argument(
                        "comm",
                        format!(
                            "device {device} runs the op but is no rank of its MeshComm: make \
                             the communicator from the mesh the shard_map runs on"
                        ),
                    )
                })?;
            let tag = Tag::of_list(&all).of(index);
            Ok(Some((groups[index].clone(), position, tag)))
        }
    }
}
