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
    /// Where the ranks meet, when the environment says (`MASTER_ADDR` and `MASTER_PORT`).
    pub rendezvous: Option<Rendezvous>,
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
            let rendezvous = rendezvous(&var)?;
            return Ok(Launch {
                launcher: family.launcher,
                rank,
                world,
                local_rank: number(family.local_rank)?.unwrap_or(0),
                rendezvous,
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

/// Where the ranks of a job meet: rank 0 listens there, the others register with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rendezvous {
    /// Rank 0 listens at this `host:port`, which every rank reads from its environment.
    At(String),
    /// Under torchrun, whose agent already serves a key-value store (torch's `TCPStore`) at
    /// `store`, `MASTER_ADDR:MASTER_PORT`: rank 0 listens on a port of `host` (`MASTER_ADDR`)
    /// that the system picks, and sets its address under `key` there for the others to read.
    /// A port chosen in advance (the one after `MASTER_PORT`, say) may already be taken on
    /// rank 0's node, and nothing would tell the other ranks which one it took instead.
    TorchrunStore {
        /// The host rank 0 listens on.
        host: String,
        /// The agent's store, `host:port`.
        store: String,
        /// The key rank 0 sets: unique to the torchrun run and its restart.
        key: String,
    },
}

impl Rendezvous {
    /// How errors and the derived job secret name it (the same text on every rank).
    pub fn name(&self) -> String {
        match self {
            Rendezvous::At(address) => address.clone(),
            Rendezvous::TorchrunStore { store, key, .. } => {
                format!("torchrun's store at {store} (key {key})")
            }
        }
    }
}

/// The variable that names the port of pipecut's rendezvous outright.
pub const RENDEZVOUS_PORT_VAR: &str = "PIPECUT_RENDEZVOUS_PORT";

/// Where the ranks meet: `MASTER_ADDR` with `PIPECUT_RENDEZVOUS_PORT` where set; else under
/// torchrun, whose agent serves its own store on `MASTER_PORT` (it says so with
/// `TORCHELASTIC_USE_AGENT_STORE=True`, with the static and the c10d rendezvous alike), a
/// port rank 0 publishes in that store; else `MASTER_ADDR:MASTER_PORT`.
fn rendezvous(var: &impl Fn(&str) -> Option<String>) -> Result<Option<Rendezvous>, Error> {
    let port = |name: &str, text: &str| -> Result<u16, Error> {
        text.trim()
            .parse()
            .map_err(|_| Error::Distributed(format!("{name}={text:?} is not a port number")))
    };
    let chosen = var(RENDEZVOUS_PORT_VAR)
        .map(|text| port(RENDEZVOUS_PORT_VAR, &text))
        .transpose()?;
    let master = var("MASTER_PORT")
        .map(|text| port("MASTER_PORT", &text))
        .transpose()?;
    let Some(host) = var("MASTER_ADDR") else {
        return Ok(None);
    };
    let by_agent = var("TORCHELASTIC_USE_AGENT_STORE").as_deref() == Some("True");
    Ok(match (chosen, master) {
        (Some(port), _) => Some(Rendezvous::At(join_host_port(&host, port))),
        (None, Some(port)) if by_agent => {
            // The run's id and restart make the key new for every attempt of every run
            // the store may see.
            let run = var("TORCHELASTIC_RUN_ID").unwrap_or_else(|| "none".into());
            let attempt = var("TORCHELASTIC_RESTART_COUNT").unwrap_or_else(|| "0".into());
            Some(Rendezvous::TorchrunStore {
                store: join_host_port(&host, port),
                key: format!("pipecut/rendezvous/{run}/attempt_{attempt}"),
                host,
            })
        }
        (None, Some(port)) => Some(Rendezvous::At(join_host_port(&host, port))),
        (None, None) => None,
    })
}

/// `host:port`, with an IPv6 literal bracketed.
pub(crate) fn join_host_port(addr: &str, port: u16) -> String {
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

    fn at(address: &str) -> Rendezvous {
        Rendezvous::At(address.into())
    }

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
        assert_eq!(l.rendezvous, Some(at("10.0.0.1:29500")));
        assert!(!l.by_mpi);
    }

    #[test]
    fn mpi_and_slurm_variables_are_read() {
        let l = launch(&[("OMPI_COMM_WORLD_RANK", "3"), ("OMPI_COMM_WORLD_SIZE", "4")]).unwrap();
        assert_eq!(
            (l.launcher, l.rank, l.world, l.local_rank),
            ("Open MPI", 3, 4, 0)
        );
        assert!(l.by_mpi && l.rendezvous.is_none());
        let l = launch(&[
            ("SLURM_PROCID", "1"),
            ("SLURM_NTASKS", "2"),
            ("SLURM_LOCALID", "1"),
        ]);
        assert_eq!(l.unwrap().launcher, "Slurm");
        let l = launch(&[("RANK", "0"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "::1")]);
        assert_eq!(l.unwrap().rendezvous, None, "no port, no rendezvous");
        let l = launch(&[
            ("RANK", "0"),
            ("WORLD_SIZE", "2"),
            ("MASTER_ADDR", "::1"),
            ("MASTER_PORT", "7"),
        ]);
        assert_eq!(l.unwrap().rendezvous, Some(at("[::1]:7")));
    }

    #[test]
    fn under_torchrun_rank_0_publishes_its_port_in_the_agents_store() {
        let torchrun = [
            ("RANK", "1"),
            ("WORLD_SIZE", "2"),
            ("MASTER_ADDR", "node0"),
            ("MASTER_PORT", "29500"),
            ("TORCHELASTIC_USE_AGENT_STORE", "True"),
            ("TORCHELASTIC_RUN_ID", "job7"),
            ("TORCHELASTIC_RESTART_COUNT", "2"),
        ];
        assert_eq!(
            launch(&torchrun).unwrap().rendezvous,
            Some(Rendezvous::TorchrunStore {
                host: "node0".into(),
                store: "node0:29500".into(),
                key: "pipecut/rendezvous/job7/attempt_2".into(),
            })
        );
        let chosen = [&torchrun[..], &[(RENDEZVOUS_PORT_VAR, "4000")]].concat();
        assert_eq!(launch(&chosen).unwrap().rendezvous, Some(at("node0:4000")));
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
