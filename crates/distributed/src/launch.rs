//! Who this process is in a job, read from the environment the cluster's launcher sets:
//! `torchrun` (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR`, `MASTER_PORT`), Open MPI's
//! `mpirun` (`OMPI_COMM_WORLD_*`), MPICH/Intel MPI's Hydra (`PMI_RANK`, `PMI_SIZE`,
//! `MPI_LOCALRANKID`) and Slurm's `srun` (`SLURM_PROCID`, `SLURM_NTASKS`, `SLURM_LOCALID`).
//!
//! The first launcher whose rank and size are both set wins, in the order above: `torchrun`
//! under Slurm sets both families, and its own numbering is the one the job means.

use crate::Error;

/// This process's place in the job, as its launcher numbered it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Launch {
    /// Which launcher's variables gave the rank (`torchrun`, `Open MPI`, ...).
    pub launcher: &'static str,
    /// This process's rank, `0..world`.
    pub rank: usize,
    /// How many processes the job has.
    pub world: usize,
    /// Rank among the processes of this machine (0 where the launcher does not say).
    pub local_rank: usize,
    /// Where rank 0 listens for the others (`MASTER_ADDR`, and `MASTER_PORT` or the port
    /// after it under torchrun, or `PIPECUT_RENDEZVOUS_PORT`), when set.
    pub master: Option<String>,
    /// Whether an MPI launcher started the job (so the MPI transport can be used).
    pub by_mpi: bool,
}

/// The variable names one launcher sets: rank, size, local rank.
struct Family {
    launcher: &'static str,
    rank: &'static str,
    world: &'static str,
    local_rank: &'static str,
    by_mpi: bool,
}

const FAMILIES: [Family; 4] = [
    Family {
        launcher: "torchrun",
        rank: "RANK",
        world: "WORLD_SIZE",
        local_rank: "LOCAL_RANK",
        by_mpi: false,
    },
    Family {
        launcher: "Open MPI",
        rank: "OMPI_COMM_WORLD_RANK",
        world: "OMPI_COMM_WORLD_SIZE",
        local_rank: "OMPI_COMM_WORLD_LOCAL_RANK",
        by_mpi: true,
    },
    Family {
        launcher: "MPICH (Hydra)",
        rank: "PMI_RANK",
        world: "PMI_SIZE",
        local_rank: "MPI_LOCALRANKID",
        by_mpi: true,
    },
    Family {
        launcher: "Slurm",
        rank: "SLURM_PROCID",
        world: "SLURM_NTASKS",
        local_rank: "SLURM_LOCALID",
        by_mpi: false,
    },
];

impl Launch {
    /// Reads the process environment.
    pub fn from_env() -> Result<Launch, Error> {
        Launch::from_vars(|name| std::env::var(name).ok())
    }

    /// Reads the variables `var` gives (the environment, or a test's map).
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Launch, Error> {
        let number = |name: &str| -> Result<Option<usize>, Error> {
            match var(name) {
                None => Ok(None),
                Some(text) => text.trim().parse().map(Some).map_err(|_| {
                    Error::Distributed(format!("{name}={text:?} is not a non-negative integer"))
                }),
            }
        };
        for family in &FAMILIES {
            let (Some(rank), Some(world)) = (number(family.rank)?, number(family.world)?) else {
                continue;
            };
            if world == 0 || rank >= world {
                return Err(Error::Distributed(format!(
                    "{}={rank} is not below {}={world}",
                    family.rank, family.world
                )));
            }
            let master = match (var("MASTER_ADDR"), rendezvous_port(&var)?) {
                (Some(addr), Some(port)) => Some(join_host_port(&addr, &port.to_string())),
                _ => None,
            };
            return Ok(Launch {
                launcher: family.launcher,
                rank,
                world,
                local_rank: number(family.local_rank)?.unwrap_or(0),
                master,
                by_mpi: family.by_mpi,
            });
        }
        Err(Error::Distributed(
            "no launcher set this process's rank: start it with torchrun, mpirun or srun, or set \
             RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT"
                .into(),
        ))
    }
}

/// The variable that names the port of pipecut's rendezvous outright.
pub const RENDEZVOUS_PORT_VAR: &str = "PIPECUT_RENDEZVOUS_PORT";

/// The port rank 0's rendezvous listens on: `PIPECUT_RENDEZVOUS_PORT` where set; else
/// `MASTER_PORT`, or the port after it under torchrun, whose agent already serves its own
/// store on `MASTER_PORT` (it says so with `TORCHELASTIC_USE_AGENT_STORE=True`, with the
/// static and the c10d rendezvous alike).
fn rendezvous_port(var: &impl Fn(&str) -> Option<String>) -> Result<Option<u16>, Error> {
    let port = |name: &str, text: &str| -> Result<u16, Error> {
        text.trim()
            .parse()
            .map_err(|_| Error::Distributed(format!("{name}={text:?} is not a port number")))
    };
    if let Some(text) = var(RENDEZVOUS_PORT_VAR) {
        return port(RENDEZVOUS_PORT_VAR, &text).map(Some);
    }
    let Some(text) = var("MASTER_PORT") else {
        return Ok(None);
    };
    let master = port("MASTER_PORT", &text)?;
    if var("TORCHELASTIC_USE_AGENT_STORE").as_deref() != Some("True") {
        return Ok(Some(master));
    }
    master.checked_add(1).map(Some).ok_or_else(|| {
        Error::Distributed(format!(
            "MASTER_PORT={master}: torchrun's store holds it and no port follows it for \
             pipecut's rendezvous; set {RENDEZVOUS_PORT_VAR}"
        ))
    })
}

/// `host:port`, with an IPv6 literal bracketed.
fn join_host_port(addr: &str, port: &str) -> String {
    if addr.contains(':') && !addr.starts_with('[') {
        format!("[{addr}]:{port}")
    } else {
        format!("{addr}:{port}")
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn launch(vars: &[(&str, &str)]) -> Result<Launch, Error> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Launch::from_vars(|name| map.get(name).cloned())
    }

    #[test]
    fn torchrun_numbering_wins_over_slurm_and_names_the_master() {
        let l = launch(&[
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "2"),
            ("RANK", "5"),
            ("WORLD_SIZE", "8"),
            ("LOCAL_RANK", "1"),
            ("MASTER_ADDR", "10.0.0.1"),
            ("MASTER_PORT", "29500"),
        ])
        .unwrap();
        assert_eq!(
            (l.launcher, l.rank, l.world, l.local_rank),
            ("torchrun", 5, 8, 1)
        );
        assert_eq!(l.master.as_deref(), Some("10.0.0.1:29500"));
        assert!(!l.by_mpi);
    }

    #[test]
    fn mpi_and_slurm_variables_are_read() {
        let l = launch(&[("OMPI_COMM_WORLD_RANK", "3"), ("OMPI_COMM_WORLD_SIZE", "4")]).unwrap();
        assert_eq!(
            (l.launcher, l.rank, l.world, l.local_rank),
            ("Open MPI", 3, 4, 0)
        );
        assert!(l.by_mpi && l.master.is_none());
        let l = launch(&[
            ("SLURM_PROCID", "1"),
            ("SLURM_NTASKS", "2"),
            ("SLURM_LOCALID", "1"),
        ]);
        assert_eq!(l.unwrap().launcher, "Slurm");
        let l = launch(&[("RANK", "0"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "::1")]);
        assert_eq!(l.unwrap().master, None, "no port, no master");
        let l = launch(&[
            ("RANK", "0"),
            ("WORLD_SIZE", "2"),
            ("MASTER_ADDR", "::1"),
            ("MASTER_PORT", "7"),
        ]);
        assert_eq!(l.unwrap().master.as_deref(), Some("[::1]:7"));
    }

    #[test]
    fn under_torchrun_the_rendezvous_takes_the_port_after_its_store() {
        let torchrun = [
            ("RANK", "1"),
            ("WORLD_SIZE", "2"),
            ("MASTER_ADDR", "node0"),
            ("MASTER_PORT", "29500"),
            ("TORCHELASTIC_USE_AGENT_STORE", "True"),
        ];
        assert_eq!(
            launch(&torchrun).unwrap().master.as_deref(),
            Some("node0:29501")
        );
        let chosen = [&torchrun[..], &[(RENDEZVOUS_PORT_VAR, "4000")]].concat();
        assert_eq!(
            launch(&chosen).unwrap().master.as_deref(),
            Some("node0:4000")
        );
        let bad = [&torchrun[..3], &[("MASTER_PORT", "http")]].concat();
        let err = launch(&bad[..]).unwrap_err().to_string();
        assert!(
            err.contains("MASTER_PORT=\"http\" is not a port number"),
            "{err}"
        );
    }

    #[test]
    fn missing_or_inconsistent_numbering_is_one_line() {
        let none = launch(&[]).unwrap_err().to_string();
        assert!(none.contains("torchrun, mpirun or srun"), "{none}");
        let high = launch(&[("RANK", "4"), ("WORLD_SIZE", "4")]).unwrap_err();
        assert!(
            high.to_string()
                .contains("RANK=4 is not below WORLD_SIZE=4"),
            "{high}"
        );
        let text = launch(&[("RANK", "one"), ("WORLD_SIZE", "4")]).unwrap_err();
        assert!(text.to_string().contains("RANK=\"one\""), "{text}");
    }
}
