//! Which devices take part in a collective together, in every form XLA writes it: replica
//! groups as explicit lists (legacy and `collective_device_list`), as an iota (reshape,
//! transpose, split) and as axes of a mesh; read in the collective's group mode (replicas,
//! partitions, both, or flattened ids) and turned into global device ids through the
//! module's device assignment, so the handler needs nothing but the call's attributes.

use super::proto::{instruction, module};
use super::wire::Message;
use super::Refusal;

/// `DeviceAssignmentProto`: the global device id of every (replica, partition).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceAssignment {
    pub replicas: usize,
    pub partitions: usize,
    /// `devices[partition][replica]`, as the proto stores them.
    devices: Vec<Vec<i64>>,
}

impl DeviceAssignment {
    pub fn of_module(module_msg: &Message) -> Result<Option<DeviceAssignment>, Refusal> {
        let Some(da) = module_msg.message(module::DEVICE_ASSIGNMENT)? else {
            return Ok(None);
        };
        let replicas = da.int(1) as usize;
        let devices = da
            .messages(3)?
            .iter()
            .map(|computation| computation.ints(1))
            .collect::<Result<Vec<_>, _>>()?;
        let partitions = da.int(2) as usize;
        if devices.len() != partitions || devices.iter().any(|d| d.len() != replicas) {
            return Err(Refusal::module(format!(
                "its device assignment ({replicas} replicas x {partitions} partitions) lists {} \
                 partitions of {:?} replicas",
                devices.len(),
                devices.iter().map(Vec::len).collect::<Vec<_>>()
            )));
        }
        Ok(Some(DeviceAssignment {
            replicas,
            partitions,
            devices,
        }))
    }

    pub fn device(&self, replica: usize, partition: usize) -> i64 {
        self.devices[partition][replica]
    }

    pub fn all_devices(&self) -> Vec<i64> {
        let mut all = Vec::with_capacity(self.replicas * self.partitions);
        for r in 0..self.replicas {
            for p in 0..self.partitions {
                all.push(self.device(r, p));
            }
        }
        all
    }
}

/// How a collective's replica groups name devices (XLA's `CollectiveOpGroupMode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Ids are replicas; each partition has the same groups.
    CrossReplica,
    /// Ids are partitions; each replica has the same groups.
    CrossPartition,
    /// Ids are replicas; a group holds every partition of its replicas.
    CrossReplicaAndPartition,
    /// Ids are `replica * partitions + partition`.
    FlattenedId,
}

impl Mode {
    /// XLA's rule: no channel id means replicas; a channel id with no
    /// `use_global_device_ids` on the op (all-to-all, ragged, permute) means partitions.
    pub fn of(inst: &Message, has_global_ids_flag: bool) -> Mode {
        let channel = inst.int(instruction::CHANNEL_ID) > 0;
        match (channel, has_global_ids_flag) {
            (false, _) => Mode::CrossReplica,
            (true, false) => Mode::CrossPartition,
            (true, true) if inst.bool(instruction::USE_GLOBAL_DEVICE_IDS) => Mode::FlattenedId,
            (true, true) => Mode::CrossReplicaAndPartition,
        }
    }
}

/// `iota(prod(dims))` reshaped to `dims`, transposed by `perm`, flattened.
fn transposed_iota(dims: &[i64], perm: &[i64]) -> Result<Vec<i64>, String> {
    let rank = dims.len();
    if perm.is_empty() {
        return Ok((0..dims.iter().product()).collect());
    }
    let mut seen = vec![false; rank];
    for &p in perm {
        match seen.get_mut(p as usize) {
            Some(s) if !*s => *s = true,
            _ => return Err(format!("{perm:?} is no permutation of {rank} dimensions")),
        }
    }
    if perm.len() != rank {
        return Err(format!("{perm:?} is no permutation of {rank} dimensions"));
    }
    let mut strides = vec![1i64; rank];
    for i in (0..rank.saturating_sub(1)).rev() {
        strides[i] = strides[i + 1] * dims[i + 1];
    }
    let out_dims: Vec<i64> = perm.iter().map(|&p| dims[p as usize]).collect();
    let total: i64 = dims.iter().product();
    let mut out = Vec::with_capacity(total as usize);
    let mut index = vec![0i64; rank];
    for _ in 0..total {
        out.push(
            index
                .iter()
                .zip(perm)
                .map(|(&i, &p)| i * strides[p as usize])
                .sum(),
        );
        for d in (0..rank).rev() {
            index[d] += 1;
            if index[d] < out_dims[d] {
                break;
            }
            index[d] = 0;
        }
    }
    Ok(out)
}

fn chunks(ids: Vec<i64>, groups: usize, size: usize) -> Result<Vec<Vec<i64>>, String> {
    if groups * size != ids.len() {
        return Err(format!(
            "{groups} groups of {size} do not hold the {} ids listed",
            ids.len()
        ));
    }
    Ok(ids.chunks(size.max(1)).map(<[i64]>::to_vec).collect())
}

/// An `IotaReplicaGroupListProto`.
fn iota_groups(list: &Message) -> Result<Vec<Vec<i64>>, String> {
    let (groups, size) = (list.int(1) as usize, list.int(2) as usize);
    let dims = list.ints(3).map_err(|e| e.0)?;
    let perm = list.ints(4).map_err(|e| e.0)?;
    let ids = if dims.is_empty() {
        (0..(groups * size) as i64).collect()
    } else {
        transposed_iota(&dims, &perm)?
    };
    chunks(ids, groups, size)
}

/// A `MeshAxesReplicaGroupListProto`: the mesh's devices vary over the listed axes within a
/// group (the first listed most major) and over the other axes between groups.
fn mesh_groups(list: &Message) -> Result<Vec<Vec<i64>>, String> {
    let mesh = list
        .message(1)
        .map_err(|e| e.0)?
        .ok_or("the mesh is missing")?;
    let sizes: Vec<usize> = mesh
        .messages(1)
        .map_err(|e| e.0)?
        .iter()
        .map(|axis| axis.int(2) as usize)
        .collect();
    let total: usize = sizes.iter().product();
    let mut ids = mesh.ints(2).map_err(|e| e.0)?;
    if ids.is_empty() {
        ids = match mesh.message(3).map_err(|e| e.0)? {
            Some(iota) => transposed_iota(
                &iota.ints(1).map_err(|e| e.0)?,
                &iota.ints(2).map_err(|e| e.0)?,
            )?,
            None => (0..total as i64).collect(),
        };
    }
    if ids.len() != total {
        return Err(format!("a mesh of {sizes:?} lists {} devices", ids.len()));
    }
    let mut axes = Vec::new();
    for axis in list.messages(2).map_err(|e| e.0)? {
        if axis.has(2) {
            return Err("it reduces over part of a mesh axis (a sub-axis)".to_string());
        }
        let index = axis.int(1) as usize;
        if index >= sizes.len() || axes.contains(&index) {
            return Err(format!("axis {index} of a mesh of {} axes", sizes.len()));
        }
        axes.push(index);
    }
    let others: Vec<usize> = (0..sizes.len()).filter(|a| !axes.contains(a)).collect();
    // Mesh strides, row-major.
    let mut strides = vec![1usize; sizes.len()];
    for i in (0..sizes.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1] * sizes[i + 1];
    }
    let odometer = |over: &[usize]| -> Vec<usize> {
        let count: usize = over.iter().map(|&a| sizes[a]).product();
        (0..count)
            .map(|mut k| {
                let mut offset = 0;
                for &a in over.iter().rev() {
                    offset += (k % sizes[a]) * strides[a];
                    k /= sizes[a];
                }
                offset
            })
            .collect()
    };
    let within = odometer(&axes);
    Ok(odometer(&others)
        .into_iter()
        .map(|base| within.iter().map(|&w| ids[base + w]).collect())
        .collect())
}

/// The collective's groups as XLA wrote them, in logical ids; empty: one group of all.
pub fn logical_groups(inst: &Message) -> Result<Vec<Vec<i64>>, String> {
    let explicit = |list: &Message, field: u32| -> Result<Vec<Vec<i64>>, String> {
        list.messages(field)
            .map_err(|e| e.0)?
            .iter()
            .map(|group| group.ints(1).map_err(|e| e.0))
            .collect()
    };
    if let Some(list) = inst
        .message(instruction::MESH_AXES_REPLICA_GROUP_LIST)
        .map_err(|e| e.0)?
    {
        return mesh_groups(&list);
    }
    if let Some(list) = inst
        .message(instruction::IOTA_COLLECTIVE_DEVICE_LIST)
        .map_err(|e| e.0)?
    {
        return iota_groups(&list);
    }
    if let Some(list) = inst
        .message(instruction::COLLECTIVE_DEVICE_LIST)
        .map_err(|e| e.0)?
    {
        if list.fields.iter().any(|f| f.number != 1) {
            return Err("its collective_device_list has a form jaxmpi does not know".into());
        }
        return explicit(&list, 1);
    }
    explicit(inst, instruction::REPLICA_GROUPS)
}

/// The groups in global device ids: every device of the assignment in exactly one.
pub fn device_groups(
    logical: &[Vec<i64>],
    mode: Mode,
    da: &DeviceAssignment,
) -> Result<Vec<Vec<i64>>, String> {
    let (replicas, partitions) = (da.replicas, da.partitions);
    let check = |id: i64, bound: usize, what: &str| -> Result<usize, String> {
        usize::try_from(id)
            .ok()
            .filter(|&i| i < bound)
            .ok_or_else(|| format!("{what} {id} is outside the module's {bound}"))
    };
    let all = |n: usize| vec![(0..n as i64).collect::<Vec<_>>()];
    let mut groups = Vec::new();
    match mode {
        Mode::CrossReplica => {
            let logical = if logical.is_empty() {
                all(replicas)
            } else {
                logical.to_vec()
            };
            for p in 0..partitions {
                for group in &logical {
                    let ids = group
                        .iter()
                        .map(|&r| Ok(da.device(check(r, replicas, "replica")?, p)));
                    groups.push(ids.collect::<Result<Vec<_>, String>>()?);
                }
            }
        }
        Mode::CrossPartition => {
            let logical = if logical.is_empty() {
                all(partitions)
            } else {
                logical.to_vec()
            };
            for r in 0..replicas {
                for group in &logical {
                    let ids = group
                        .iter()
                        .map(|&p| Ok(da.device(r, check(p, partitions, "partition")?)));
                    groups.push(ids.collect::<Result<Vec<_>, String>>()?);
                }
            }
        }
        Mode::CrossReplicaAndPartition => {
            let logical = if logical.is_empty() {
                all(replicas)
            } else {
                logical.to_vec()
            };
            for group in &logical {
                let mut ids = Vec::new();
                for &r in group {
                    let r = check(r, replicas, "replica")?;
                    ids.extend((0..partitions).map(|p| da.device(r, p)));
                }
                groups.push(ids);
            }
        }
        Mode::FlattenedId => {
            if logical.is_empty() {
                return Err("flattened device ids with no replica groups".into());
            }
            for group in logical {
                let ids = group.iter().map(|&id| {
                    let id = check(id, replicas * partitions, "device")?;
                    Ok(da.device(id / partitions, id % partitions))
                });
                groups.push(ids.collect::<Result<Vec<_>, String>>()?);
            }
        }
    }
    let mut seen: Vec<i64> = groups.iter().flatten().copied().collect();
    seen.sort_unstable();
    let mut expected = da.all_devices();
    expected.sort_unstable();
    if seen != expected {
        return Err(format!(
            "its groups {groups:?} do not take every device of the module exactly once"
        ));
    }
    Ok(groups)
}

/// A collective-permute's (source, target) pairs in global device ids.
pub fn device_pairs(
    inst: &Message,
    mode: Mode,
    da: &DeviceAssignment,
) -> Result<Vec<(i64, i64)>, String> {
    let mut pairs = Vec::new();
    let logical: Vec<(i64, i64)> = inst
        .messages(instruction::SOURCE_TARGET_PAIRS)
        .map_err(|e| e.0)?
        .iter()
        .map(|pair| (pair.int(1), pair.int(2)))
        .collect();
    let (outer, inner) = match mode {
        Mode::CrossReplica => (da.partitions, da.replicas),
        _ => (da.replicas, da.partitions),
    };
    for fixed in 0..outer {
        for &(source, target) in &logical {
            let at = |id: i64| -> Result<i64, String> {
                let id = usize::try_from(id)
                    .ok()
                    .filter(|&i| i < inner)
                    .ok_or_else(|| format!("id {id} is outside the module's {inner}"))?;
                Ok(match mode {
                    Mode::CrossReplica => da.device(id, fixed),
                    _ => da.device(fixed, id),
                })
            };
            pairs.push((at(source)?, at(target)?));
        }
    }
    Ok(pairs)
}

#[cfg(test)]
#[path = "groups_tests.rs"]
mod tests;
