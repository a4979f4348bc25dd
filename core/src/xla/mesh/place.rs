//! Where a call's device stands: its group and its position there, found once per thread
//! for each way a call names its group, and remembered (no lock on later calls).

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Arc;

use super::group::{self, Group, Kind};
use super::mesh_comms;
use crate::{Error, Library, Result};

/// A device's group and its position there; for a collective-permute, the pairs among
/// the group's positions (empty otherwise), and what sets the permute apart from another
/// over the same group (`CallKey::detail`).
#[derive(Clone)]
pub struct Place {
    pub group: Arc<Group>,
    pub position: usize,
    pub pairs: Arc<[(usize, usize)]>,
    pub detail: u64,
}

/// How a call names its group.
#[derive(Clone, Copy)]
pub enum Naming<'a> {
    /// XLA's collective, by its attribute (`at`: where it lies, the key a program's calls
    /// share) listing its groups: each group's size, then its devices.
    Groups { at: (usize, usize), flat: &'a [i64] },
    /// XLA's collective-permute, by its attribute of (source, target) pairs: the group of
    /// a device is every device its pairs connect to it (`connected`).
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
    let place = find(library, naming, device)?;
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

fn find(library: &dyn Library, naming: Naming, device: i64) -> Result<Option<Place>> {
    let at = |kind, devices: &[i64], position, pairs: Vec<(usize, usize)>, detail| {
        Ok(Some(Place {
            group: group::group(library, kind, devices)?,
            position,
            pairs: pairs.into(),
            detail,
        }))
    };
    match naming {
        Naming::Groups { flat, .. } => {
            let group = listed(flat)?
                .into_iter()
                .find(|g| g.contains(&device))
                .ok_or_else(|| {
                    Error::invalid_argument(
                        "groups",
                        format!("device {device} is in none of the collective's groups"),
                    )
                })?;
            let position = group.iter().position(|&d| d == device).unwrap_or(0);
            at(Kind::Program, group, position, Vec::new(), 0)
        }
        Naming::Pairs { flat, .. } => {
            let Some(members) = connected(flat).into_iter().find(|g| g.contains(&device)) else {
                return Ok(None);
            };
            let position = |d: i64| members.binary_search(&d).unwrap_or(0);
            let pairs: Vec<(usize, usize)> = flat
                .chunks(2)
                .filter(|p| members.binary_search(&p[0]).is_ok())
                .map(|p| (position(p[0]), position(p[1])))
                .collect();
            let detail = pairs.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &(s, t)| {
                (h ^ (s as u64) << 32 ^ t as u64).wrapping_mul(0x0100_0000_01b3)
            });
            at(Kind::Program, &members, position(device), pairs, detail)
        }
        Naming::MeshComm(id) => {
            let groups = mesh_comms::groups(id)?;
            let (group, position) = groups
                .iter()
                .find_map(|g| g.iter().position(|&d| d == device).map(|p| (g, p)))
                .ok_or_else(|| {
                    Error::invalid_argument(
                        "comm",
                        format!(
                            "device {device} runs the op but is no rank of its MeshComm: make \
                             the communicator from the mesh the shard_map runs on"
                        ),
                    )
                })?;
            at(Kind::MeshComm, group, position, Vec::new(), 0)
        }
    }
}

/// A `groups` attribute's groups: each group's size, then its devices.
pub fn listed(flat: &[i64]) -> Result<Vec<&[i64]>> {
    let mut groups = Vec::new();
    let mut at = 0;
    while at < flat.len() {
        let len = usize::try_from(flat[at]).unwrap_or(usize::MAX);
        let group = flat
            .get(at + 1..(at + 1).saturating_add(len))
            .ok_or_else(|| Error::invalid_argument("groups", "the attribute is cut short"))?;
        groups.push(group);
        at += 1 + len;
    }
    Ok(groups)
}

/// A collective-permute's groups: the devices its (source, target) pairs connect, each
/// group in ascending order, the groups in the order their first device appears. Each
/// group's messages stay inside it, so each is a collective of its own: devices of one
/// process that take different branches of a program may each run the permute of
/// theirs, and a process holds only the communicators of the groups it is in.
pub fn connected(flat: &[i64]) -> Vec<Vec<i64>> {
    let mut devices: Vec<i64> = Vec::new();
    let mut indices: HashMap<i64, usize> = HashMap::new();
    for &d in flat {
        indices.entry(d).or_insert_with(|| {
            devices.push(d);
            devices.len() - 1
        });
    }
    let index = |d: i64| indices[&d];
    let mut parent: Vec<usize> = (0..devices.len()).collect();
    fn root(parent: &mut [usize], mut i: usize) -> usize {
        while parent[i] != i {
            parent[i] = parent[parent[i]];
            i = parent[i];
        }
        i
    }
    for pair in flat.chunks(2) {
        if let [s, t] = *pair {
            let (a, b) = (root(&mut parent, index(s)), root(&mut parent, index(t)));
            parent[a.max(b)] = a.min(b);
        }
    }
    let mut groups: Vec<Vec<i64>> = Vec::new();
    let mut group_of: Vec<Option<usize>> = vec![None; devices.len()];
    for (i, &device) in devices.iter().enumerate() {
        let r = root(&mut parent, i);
        let g = *group_of[r].get_or_insert_with(|| {
            groups.push(Vec::new());
            groups.len() - 1
        });
        groups[g].push(device);
    }
    for group in &mut groups {
        group.sort_unstable();
    }
    groups
}

#[cfg(test)]
mod tests {
    use super::connected;

    #[test]
    fn a_permute_splits_into_the_devices_its_pairs_connect() {
        // 2 x 2, a ring along the process axis: {0, 2} and {1, 3}.
        assert_eq!(
            connected(&[0, 2, 2, 0, 1, 3, 3, 1]),
            [vec![0, 2], vec![1, 3]]
        );
        // 3 x 2, a flip: (i, 5 - i).
        let flip: Vec<i64> = (0..6).flat_map(|i| [i, 5 - i]).collect();
        assert_eq!(connected(&flip), [vec![0, 5], vec![1, 4], vec![2, 3]]);
        // A self-loop is a group of its own; a chain joins every device it passes.
        assert_eq!(connected(&[4, 4, 0, 1, 1, 2]), [vec![4], vec![0, 1, 2]]);
        assert_eq!(connected(&[]), Vec::<Vec<i64>>::new());
    }
}
