use super::*;
use std::collections::HashMap;

fn env(pairs: &[(&str, &str)]) -> Result<Option<RankEnv>, DistError> {
    let map: HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    RankEnv::from_vars(|k| map.get(k).cloned())
}

#[test]
fn no_world_is_a_single_process() {
    assert_eq!(env(&[]).unwrap(), None);
    assert_eq!(env(&[("WORLD_SIZE", "1"), ("RANK", "0")]).unwrap(), None);
}

#[test]
fn torchrun_variables_are_read() {
    let e = env(&[
        ("WORLD_SIZE", "4"),
        ("RANK", "3"),
        ("LOCAL_RANK", "1"),
        ("LOCAL_WORLD_SIZE", "2"),
        ("MASTER_ADDR", "10.0.0.1"),
        ("MASTER_PORT", "29500"),
    ])
    .unwrap()
    .unwrap();
    assert_eq!((e.rank, e.world, e.local_rank, e.local_world), (3, 4, 1, 2));
    assert_eq!(e.nodes(), 2, "4 ranks, 2 per node");
    assert_eq!((e.master_addr.as_str(), e.master_port), ("10.0.0.1", 29500));
}

#[test]
fn bad_variables_are_named() {
    let msg = |p: &[(&str, &str)]| env(p).unwrap_err().to_string();
    assert!(msg(&[("WORLD_SIZE", "two")]).contains("WORLD_SIZE"));
    assert!(msg(&[("WORLD_SIZE", "2")]).contains("RANK is not set"));
    assert!(msg(&[("WORLD_SIZE", "2"), ("RANK", "2"), ("MASTER_PORT", "1")]).contains("not below"));
    assert!(msg(&[("WORLD_SIZE", "2"), ("RANK", "1")]).contains("MASTER_PORT"));
    assert!(msg(&[("WORLD_SIZE", "2"), ("RANK", "1"), ("MASTER_PORT", "99999")]).contains("port"));
}

#[test]
fn the_backend_follows_the_device() {
    let cuda = tch::Device::Cuda(1);
    let cpu = tch::Device::Cpu;
    for built in [true, false] {
        assert_eq!(
            Backend::Auto.choose(cpu, built).unwrap(),
            (Collectives::Gloo, None)
        );
        assert_eq!(
            Backend::Gloo.choose(cpu, built).unwrap(),
            (Collectives::Gloo, None)
        );
        assert_eq!(
            Backend::Gloo.choose(cuda, built).unwrap(),
            (Collectives::Gloo, None)
        );
        let e = Backend::Nccl.choose(cpu, built).unwrap_err().to_string();
        assert!(
            e.contains("backend = \"nccl\" needs a CUDA device") && e.contains("Cpu"),
            "{e}"
        );
    }
    assert_eq!(
        Backend::Auto.choose(cuda, true).unwrap(),
        (Collectives::Nccl, None)
    );
    assert_eq!(
        Backend::Nccl.choose(cuda, true).unwrap(),
        (Collectives::Nccl, None)
    );
    // A build without NCCL: auto falls back to Gloo and says why; nccl is an error.
    let (c, warning) = Backend::Auto.choose(cuda, false).unwrap();
    assert_eq!(c, Collectives::Gloo);
    let warning = warning.unwrap();
    assert!(
        warning.contains("uses Gloo") && warning.contains("without c10d's NCCL"),
        "{warning}"
    );
    let e = Backend::Nccl.choose(cuda, false).unwrap_err().to_string();
    assert!(
        e.contains("built without c10d's NCCL backend") && e.contains("gloo"),
        "{e}"
    );
}

#[test]
fn this_build_has_nccl_when_its_libtorch_has_cuda() {
    // build.rs compiles the NCCL backend when libtorch_cuda and the headers are there, as
    // they are for the PyPI CUDA wheel that scripts/ensure-libtorch.sh installs.
    if env!("TESSERA_LIBTORCH_HAS_CUDA") == "1" {
        assert!(
            nccl_built(),
            "libtorch has CUDA but the c10d shim was built without NCCL"
        );
    }
}

/// Joins a one-rank group on a port the system just gave out. Another test of this binary
/// can take that port between its release and the store's bind (rank 0's TCP store then
/// fails with "Address already in use"), and a store left by a failed join can still hold
/// its port: such a try is repeated on a fresh port.
fn join_alone(collectives: Collectives, device: tch::Device) -> Result<Group, DistError> {
    let mut tries = 0;
    loop {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .unwrap();
        let env = RankEnv {
            rank: 0,
            world: 1,
            local_rank: 0,
            local_world: 1,
            master_addr: "127.0.0.1".into(),
            master_port: port,
        };
        let joined = Group::join(
            &env,
            Duration::from_secs(20),
            Duration::from_secs(20),
            collectives,
            device,
        );
        match joined {
            Err(e) if tries < 5 && e.to_string().contains("already in use") => tries += 1,
            other => return other,
        }
    }
}

/// A one-rank group asked for NCCL reaches c10d's `ProcessGroupNCCL` (its symbols link from
/// libtorch_cuda): on a machine without a GPU, its own refusal comes back as the error.
#[test]
fn nccl_is_linked_and_refuses_a_machine_without_gpu() {
    if !nccl_built() || crate::device::cuda_device_count() > 0 {
        return;
    }
    let e = join_alone(Collectives::Nccl, tch::Device::Cuda(0))
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("(NCCL on cuda:0)"), "{e}");
    assert!(
        e.contains("GPU") || e.contains("CUDA") || e.contains("cuda"),
        "{e}"
    );
    // The same group over Gloo works on this machine.
    let g = join_alone(Collectives::Gloo, tch::Device::Cpu).unwrap();
    assert_eq!(g.all_reduce_values(&[1.5], Op::Sum).unwrap(), vec![1.5]);
}
