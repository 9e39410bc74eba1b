//! How much CPU the rest of the machine used while a measurement ran.
//!
//! `bench-plans` pins one stage to each core and compares thread CPU times. That account is
//! not inflated by other processes the way wall time is, but it still moves with them: a
//! process sharing a stage's core evicts its caches, and on the project's 2-core VM with
//! other builds running, stage shares drifted by up to 8 points and a 1.05× win measured as
//! 0.97×. The figures are only worth publishing when the machine was otherwise idle, so the
//! report says how busy it was: the machine's busy CPU time over the run (`/proc/stat`,
//! steal included: a hypervisor's other guests count too) minus this process's own.

use std::time::Instant;

/// Other processes using more than this many cores on average make a run "busy".
pub const BUSY_CORES: f64 = 0.25;

/// A reading taken before a measurement; `finish` compares it with one taken after.
pub struct LoadProbe {
    machine_busy_secs: f64,
    own_cpu_secs: f64,
    began: Instant,
}

impl LoadProbe {
    /// `None` where the platform does not say (anything but Linux).
    pub fn start() -> Option<Self> {
        Some(LoadProbe {
            machine_busy_secs: machine_busy_secs()?,
            own_cpu_secs: own_cpu_secs()?,
            began: Instant::now(),
        })
    }

    /// The average number of cores other processes kept busy since `start`.
    pub fn finish(self) -> Option<f64> {
        let wall = self.began.elapsed().as_secs_f64();
        let machine = machine_busy_secs()? - self.machine_busy_secs;
        let own = own_cpu_secs()? - self.own_cpu_secs;
        (wall > 0.0).then(|| ((machine - own) / wall).max(0.0))
    }
}

/// Busy CPU seconds of the whole machine since boot: the first line of `/proc/stat`, every
/// field but idle and iowait (guest time is already inside user time).
fn machine_busy_secs() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    Some(busy_ticks(stat.lines().next()?)? as f64 / ticks_per_sec()?)
}

fn busy_ticks(cpu_line: &str) -> Option<u64> {
    let mut fields = cpu_line.split_whitespace();
    if fields.next()? != "cpu" {
        return None;
    }
    let ticks: Vec<u64> = fields.map(|f| f.parse().ok()).collect::<Option<_>>()?;
    // user nice system idle iowait irq softirq steal [guest guest_nice]
    let at = |i: usize| ticks.get(i).copied().unwrap_or(0);
    (ticks.len() >= 4).then(|| at(0) + at(1) + at(2) + at(5) + at(6) + at(7))
}

fn ticks_per_sec() -> Option<f64> {
    #[cfg(unix)]
    {
        // SAFETY: sysconf reads a configuration value and has no other effect.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
        if hz > 0 {
            return Some(hz as f64);
        }
    }
    None
}

/// CPU seconds this process has used, every thread together.
fn own_cpu_secs() -> Option<f64> {
    #[cfg(unix)]
    {
        let mut t = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: clock_gettime writes one timespec into `t`.
        if unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut t) } == 0 {
            return Some(t.tv_sec as f64 + t.tv_nsec as f64 * 1e-9);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busy_ticks_leave_out_idle_and_iowait() {
        let line = "cpu  100 5 20 9000 300 1 2 7 50 0";
        assert_eq!(busy_ticks(line), Some(100 + 5 + 20 + 1 + 2 + 7));
        assert_eq!(busy_ticks("cpu0 1 2 3 4"), None);
        assert_eq!(busy_ticks("cpu 1 x 3 4"), None);
        assert_eq!(busy_ticks("cpu 1 2"), None);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_probe_counts_the_cpu_time_of_another_process() {
        let probe = LoadProbe::start().expect("Linux has /proc/stat");
        let child = std::process::Command::new("sh")
            .args(["-c", "i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done"])
            .status()
            .expect("sh runs");
        assert!(child.success());
        let wall = probe.began.elapsed().as_secs_f64();
        let others = probe.finish().unwrap();
        // SAFETY: getrusage fills one rusage.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        assert_eq!(
            unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut usage) },
            0
        );
        let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
        let child_cpu = secs(usage.ru_utime) + secs(usage.ru_stime);
        // Two readings of a 100 Hz tick counter: up to 20 ms lost to rounding.
        assert!(
            others * wall >= child_cpu - 0.03,
            "others {others} cores over {wall} s, the child alone used {child_cpu} s"
        );
    }
}
