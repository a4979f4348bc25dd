//! Where a call's device stands: its group and its position there, found once per thread
//! for each way a call names its group, and remembered (no lock on later calls).

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Arc;

use super::group::{self, Group, Kind};
use super::mesh_comms;
use crate::{Error, Library, Result};

/// A device's group and its position there; for a collective-permute, the pairs among
/// the group's positions that this process's devices send or receive (empty otherwise), and what sets the permute apart from another
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

#[derive(Clone, Copy, PartialEq, Eq, Hash)]
enum Key {
    Attribute((usize, usize)),
    MeshComm(i64),
}

/// A place found, and the attribute's contents it was found from.
struct Remembered {
    contents: Box<[i64]>,
    place: Option<Place>,
}

thread_local! {
    static PLACES: RefCell<HashMap<(Key, i64), Remembered>> = RefCell::new(HashMap::new());
}

/// How many places a thread remembers before it starts again: far more than the
/// collectives of any program (one per collective instruction a device runs), so that
/// a program's calls never miss after its first run; the bound only stops programs
/// compiled one after another, each leaving its attributes behind, from growing the map.
const REMEMBERED: usize = 1 << 14;

/// `device`'s group and position among the groups `naming` gives; None where a pair
/// names it not. A call after the first on a thread looks up its attribute's address and
/// compares its contents (which another program's may have replaced since): no lock, no
/// hashing of the devices.
pub fn placed(library: &dyn Library, naming: Naming, device: i64) -> Result<Option<Place>> {
    let key = (naming.key(), device);
    let known = PLACES.with_borrow(|places| {
        places
            .get(&key)
            .filter(|r| *r.contents == *naming.contents())
            .map(|r| r.place.clone())
    });
    if let Some(place) = known {
        return Ok(place);
    }
    let place = find(library, naming, device)?;
    PLACES.with_borrow_mut(|places| {
        if places.len() == REMEMBERED {
            places.clear();
        }
        let contents = naming.contents().into();
        let place = place.clone();
        places.insert(key, Remembered { contents, place });
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
            let group = group::group(library, Kind::Permute, &members)?;
            let (pairs, detail) = pairs_of(flat, &members, &group);
            Ok(Some(Place {
                position: members.binary_search(&device).unwrap_or(0),
                group,
                pairs: pairs.into(),
                detail,
            }))
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

/// The pairs (as positions among `members`, ascending) of a permute's pairs `flat` that
/// this process's devices of `group` send or receive, and a hash of all the group's
/// pairs (`Place::detail`).
pub fn pairs_of(flat: &[i64], members: &[i64], group: &Group) -> (Vec<(usize, usize)>, u64) {
    let position = |d: i64| members.binary_search(&d).unwrap_or(0);
    let mut detail = 0xcbf2_9ce4_8422_2325u64;
    let mut pairs = Vec::new();
    for pair in flat.chunks(2) {
        if members.binary_search(&pair[0]).is_err() {
            continue;
        }
        let (s, t) = (position(pair[0]), position(pair[1]));
        detail = (detail ^ (s as u64) << 32 ^ t as u64).wrapping_mul(0x0100_0000_01b3);
        if group.is_local(s) || group.is_local(t) {
            pairs.push((s, t));
        }
    }
    (pairs, detail)
}

/// A `groups` attribute's groups: each group's size, then its devices.
pub fn listed(flat: &[i64]) -> Result<Vec<&[i64]>> {
    Ok(listed_kinds(flat)?.into_iter().map(|(_, g)| g).collect())
}

/// A program prologue's groups (`hlo::rewrite::encode_prologue`): each group's size,
/// negative for a permute's, then its devices.
pub fn listed_kinds(flat: &[i64]) -> Result<Vec<(Kind, &[i64])>> {
    let mut groups = Vec::new();
    let mut at = 0;
    while at < flat.len() {
        let kind = if flat[at] < 0 {
            Kind::Permute
        } else {
            Kind::Program
        };
        let len = usize::try_from(flat[at].unsigned_abs()).unwrap_or(usize::MAX);
        let group = flat
            .get(at + 1..(at + 1).saturating_add(len))
            .ok_or_else(|| Error::invalid_argument("groups", "the attribute is cut short"))?;
        groups.push((kind, group));
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
