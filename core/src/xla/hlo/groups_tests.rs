//! The forms of device groups XLA writes, read back into global device ids.

use super::*;

fn da(replicas: usize, devices: Vec<Vec<i64>>) -> DeviceAssignment {
    DeviceAssignment {
        replicas,
        partitions: devices.len(),
        devices,
    }
}

#[test]
fn an_iota_list_is_reshaped_transposed_and_split() {
    // [[0,2],[1,3]]: iota(4).reshape(2,2).T
    let mut list = Message::default();
    list.set_int(1, 2);
    list.set_int(2, 2);
    list.set_ints(3, &[2, 2]);
    list.set_ints(4, &[1, 0]);
    assert_eq!(iota_groups(&list).unwrap(), vec![vec![0, 2], vec![1, 3]]);
}

#[test]
fn mesh_axes_vary_within_a_group() {
    // mesh (a=2, b=3) of iota devices; groups over b: rows; over a: columns.
    let mut mesh = Message::default();
    for size in [2, 3] {
        let mut axis = Message::default();
        axis.set_int(2, size);
        mesh.push_message(1, &axis);
    }
    let over = |axes: &[i64]| {
        let mut list = Message::default();
        list.set_message(1, &mesh);
        for &a in axes {
            let mut r = Message::default();
            r.set_int(1, a);
            list.push_message(2, &r);
        }
        mesh_groups(&list).unwrap()
    };
    assert_eq!(over(&[1]), vec![vec![0, 1, 2], vec![3, 4, 5]]);
    assert_eq!(over(&[0]), vec![vec![0, 3], vec![1, 4], vec![2, 5]]);
    assert_eq!(over(&[1, 0]), vec![vec![0, 3, 1, 4, 2, 5]]);
}

#[test]
fn modes_map_logical_ids_to_devices() {
    // 1 replica x 4 partitions on devices 0, 1, 2048, 2049.
    let four = da(1, vec![vec![0], vec![1], vec![2048], vec![2049]]);
    let groups = device_groups(&[vec![0, 2], vec![1, 3]], Mode::FlattenedId, &four).unwrap();
    assert_eq!(groups, vec![vec![0, 2048], vec![1, 2049]]);
    let all = device_groups(&[], Mode::CrossPartition, &four).unwrap();
    assert_eq!(all, vec![vec![0, 1, 2048, 2049]]);
    let crp = device_groups(&[vec![0]], Mode::CrossReplicaAndPartition, &four).unwrap();
    assert_eq!(crp, vec![vec![0, 1, 2048, 2049]]);
    // 2 replicas x 1 partition, cross-replica.
    let two = da(2, vec![vec![5, 7]]);
    assert_eq!(
        device_groups(&[], Mode::CrossReplica, &two).unwrap(),
        vec![vec![5, 7]]
    );
}

#[test]
fn groups_that_miss_a_device_are_refused() {
    let four = da(1, vec![vec![0], vec![1], vec![2], vec![3]]);
    let err = device_groups(&[vec![0, 1]], Mode::FlattenedId, &four).unwrap_err();
    assert!(err.contains("exactly once"), "{err}");
}

#[test]
fn permute_pairs_are_repeated_per_replica() {
    let two = da(2, vec![vec![0, 2], vec![1, 3]]);
    let mut inst = Message::default();
    let mut pair = Message::default();
    pair.set_int(1, 0);
    pair.set_int(2, 1);
    inst.push_message(instruction::SOURCE_TARGET_PAIRS, &pair);
    let pairs = device_pairs(&inst, Mode::CrossPartition, &two).unwrap();
    assert_eq!(pairs, vec![(0, 1), (2, 3)]);
}
