//! The ideal search's first pass: whether any plan is within a bound, decided by a dynamic
//! programme over the ideals of each stage's region instead of a walk from every prefix
//! (docs/algorithms.md, "The ideal search").
//!
//! Stage `k` goes from the prefix `P_k` to `P_{k+1}`. Within the windows, every ideal between
//! them holds the nodes whose latest stage is before `k` and none whose earliest stage is after
//! `k`: the *region* of stage `k`, a lattice that is small where the windows are narrow (about
//! 150,000 ideals for llama_tiny's widest stage at K = 8). By the search's sums, stage `k` fits
//! the bound `B` from `P` to `Q ⊋ P` when
//!
//! `receive_k(P) − compute_k(P) + compute_k(Q) + gradient_k(Q) ≤ B`,
//!
//! a term of `P` alone plus terms of `Q` alone. So for each ideal `Q` of the region it is enough
//! to know the least `receive_k(P) − compute_k(P)` over the reachable prefixes `P ⊊ Q`. Every
//! such `P` lies inside `Q` less one of its maximal nodes (take `m` maximal in `Q \ P`: a
//! successor of `m` inside `Q` would be in `Q \ P` too, since `P` is downward closed), so that
//! least value is a minimum over `Q`'s maximal nodes of the same least value one node down.
//! Each ideal costs its maximal nodes, where the walk enumerated every `Q` again from every `P`.
//!
//! The regions are enumerated once, at the windows of the bound the search had then, with each
//! ideal's figures and the ideals one maximal node down. Windows only narrow as the bound falls,
//! so the same regions hold every plan within any lower bound, and each bound after is one sweep
//! over arrays ([`Lattice::sweep`]).
//!
//! Memory and pinned cuts are left out: the sweep decides a relaxation, so "no plan" is a proof,
//! while a plan it finds is one the caller evaluates, and the walk takes over when that plan
//! does not fit.

use std::hash::BuildHasher;

use hashbrown::HashTable;

use super::{Search, SearchEnd};
use crate::partition::problem::StageId;

/// Ideals all regions may hold together. Each costs its key (twice while the next region's
/// index is built), four figures, the ideals below it and, while it is enumerated, a copy and
/// its pairs: about 200 bytes at the peak (paraphrase-MiniLM's 1.6 million ideals: 330 MB peak
/// RSS for the whole command). Larger lattices are left to the walk.
const MAX_IDEALS: usize = 2 << 20;

/// Words of an ideal's key: a region with more free nodes is left to the walk.
const KEY_WORDS: usize = 4;
const MAX_FREE: usize = KEY_WORDS * 64;

/// An ideal of a region, as bits over its free nodes.
type Key = [u64; KEY_WORDS];

/// Slack on the stage test. The sweep subtracts prefix sums where the walk adds a stage's
/// nodes, which may differ in the last bits; far below the bound's own margin
/// ([`RELATIVE_TOLERANCE`](crate::partition::dp::RELATIVE_TOLERANCE)), so that a plan it finds
/// is still below the incumbent.
const SUM_SLACK: f64 = 1e-12;

/// No ideal: an ideal that is no prefix, or no prefix found.
const NONE: u32 = u32::MAX;

/// What stage `k` (and stage `k + 1`) make of a prefix that is exactly one ideal.
#[derive(Clone, Copy)]
struct Figures {
    /// The ideal's compute on stage `k`'s device kind and on stage `k + 1`'s.
    compute_here: f64,
    compute_next: f64,
    /// What stage `k` receives after it, and what stage `k + 1` receives (its forward input,
    /// or in training stage `k`'s gradient).
    receive_here: f64,
    receive_next: f64,
}

/// The ideals of one stage's region, numbered fewest nodes first: each comes after every
/// ideal inside it, so a sweep runs through them in order.
struct Region {
    /// The positions neither forced in nor kept out, ascending; bit `i` of a key is `free[i]`.
    free: Vec<usize>,
    /// Positions forced into every ideal (latest stage before this one), as bits over all.
    forced: Vec<u64>,
    keys: Vec<Key>,
    figures: Vec<Figures>,
    /// The ideals one maximal node down from each (`below[below_from[i]..below_from[i + 1]]`).
    below_from: Vec<u32>,
    below: Vec<u32>,
    /// Per ideal, its id in the next stage's region when it may be the next prefix (it holds
    /// every node whose latest stage is this one); [`NONE`] otherwise. In the last region, any
    /// id but [`NONE`] marks a possible last prefix.
    next_id: Vec<u32>,
}

impl Region {
    fn len(&self) -> usize {
        self.figures.len()
    }

    fn below(&self, id: usize) -> &[u32] {
        &self.below[self.below_from[id] as usize..self.below_from[id + 1] as usize]
    }

    /// The ideal as bits over every position.
    fn nodes(&self, id: usize) -> Vec<u64> {
        let mut nodes = self.forced.clone();
        for i in ones(&self.keys[id]) {
            let v = self.free[i];
            nodes[v / 64] |= 1 << (v % 64);
        }
        nodes
    }
}

/// The regions of stages `0..K − 1` (the last stage takes what is left).
pub(super) struct Lattice {
    regions: Vec<Region>,
    training: bool,
    node_count: usize,
    /// The whole graph's compute on the last stage's device kind.
    total_last_secs: f64,
}

/// A region's ideals by key. The keys are stored in the table itself: a lookup then reads one
/// entry instead of an id and a key elsewhere, and the lookups are most of building a lattice.
struct KeyIndex {
    table: HashTable<(Key, u32)>,
    hasher: foldhash::fast::FixedState,
}

impl KeyIndex {
    fn new(keys: &[Key]) -> KeyIndex {
        let mut index = KeyIndex {
            table: HashTable::with_capacity(keys.len()),
            hasher: foldhash::fast::FixedState::default(),
        };
        let hasher = index.hasher;
        for (id, key) in keys.iter().enumerate() {
            index
                .table
                .insert_unique(hasher.hash_one(key), (*key, id as u32), |(key, _)| {
                    hasher.hash_one(key)
                });
        }
        index
    }

    fn find(&self, key: &Key) -> Option<usize> {
        self.table
            .find(self.hasher.hash_one(key), |(other, _)| other == key)
            .map(|&(_, id)| id as usize)
    }
}

/// Why no lattice was built.
pub(super) enum NotBuilt {
    /// The regions hold more than [`MAX_IDEALS`] ideals, or one has more than [`MAX_FREE`]
    /// free nodes.
    TooLarge,
    Stopped(SearchEnd),
}

/// A region being enumerated: the ideal so far and its running figures, and the ideals found.
struct Enumeration {
    free: Vec<usize>,
    inside: Vec<bool>,
    readers_in: Vec<u32>,
    messages: usize,
    bytes: u64,
    bits: Key,
    /// Each free node's free successors.
    successors: Vec<Key>,
    keys: Vec<Key>,
    figures: Vec<Figures>,
    /// Pairs of ideals (by enumeration order) where the second is the first less a maximal
    /// node.
    downs: Vec<(u32, u32)>,
}

/// Figures restored by copy on the way back (times summed and subtracted would drift).
#[derive(Clone, Copy)]
struct Sums {
    compute_here: f64,
    compute_next: f64,
}

impl Search<'_> {
    /// The regions at the current windows.
    pub(super) fn build_lattice(&mut self) -> Result<Lattice, NotBuilt> {
        let k = self.problem.stage_count();
        // Counting first is a fraction of building, so a lattice too large costs little.
        let mut counted = 0;
        for stage in 0..k - 1 {
            counted += self.count_region(stage, MAX_IDEALS - counted)?;
        }
        let mut regions: Vec<Region> = Vec::with_capacity(k - 1);
        for stage in 0..k - 1 {
            regions.push(self.region(stage)?);
        }
        for stage in 0..k - 1 {
            let next_index = regions.get(stage + 1).map(|next| KeyIndex::new(&next.keys));
            regions[stage].next_id = self.next_ids(&regions, next_index.as_ref(), stage);
        }
        Ok(Lattice {
            regions,
            training: self.training(),
            node_count: self.problem.node_count(),
            total_last_secs: self.shape.total_last_secs,
        })
    }

    /// The positions of stage `stage`'s region that are neither forced in nor kept out.
    fn free_in(&self, stage: usize) -> Vec<usize> {
        (0..self.problem.node_count())
            .filter(|&v| self.latest[v] >= stage && self.earliest[v] <= stage)
            .collect()
    }

    /// How many ideals stage `stage`'s region has; [`NotBuilt::TooLarge`] past `most`.
    fn count_region(&mut self, stage: usize, most: usize) -> Result<usize, NotBuilt> {
        let free = self.free_in(stage);
        if free.len() > MAX_FREE {
            return Err(NotBuilt::TooLarge);
        }
        let mut inside: Vec<bool> = self.latest.iter().map(|&l| l < stage).collect();
        let mut count = 0;
        self.count_from(&free, &mut inside, 0, &mut count, most)?;
        Ok(count)
    }

    fn count_from(
        &mut self,
        free: &[usize],
        inside: &mut [bool],
        mut i: usize,
        count: &mut usize,
        most: usize,
    ) -> Result<(), NotBuilt> {
        if let Some(end) = self.tick() {
            return Err(NotBuilt::Stopped(end));
        }
        let preds = &self.shape.preds;
        while free
            .get(i)
            .is_some_and(|&v| !preds[v].iter().all(|&p| inside[p as usize]))
        {
            i += 1;
        }
        let Some(&v) = free.get(i) else {
            *count += 1;
            return match *count > most {
                true => Err(NotBuilt::TooLarge),
                false => Ok(()),
            };
        };
        inside[v] = true;
        let outcome = self.count_from(free, inside, i + 1, count, most);
        inside[v] = false;
        outcome?;
        self.count_from(free, inside, i + 1, count, most)
    }

    /// Every ideal of stage `stage`'s region, with its figures and the ideals one maximal node
    /// below each, fewest nodes first.
    fn region(&mut self, stage: usize) -> Result<Region, NotBuilt> {
        let (problem, n) = (self.problem, self.problem.node_count());
        let free = self.free_in(stage);
        let mut forced = vec![0; n.div_ceil(64)];
        let mut state = Enumeration {
            successors: self.free_successors(&free),
            free,
            inside: vec![false; n],
            readers_in: vec![0; problem.flows().len()],
            messages: 0,
            bytes: 0,
            bits: [0; KEY_WORDS],
            keys: Vec::new(),
            figures: Vec::new(),
            downs: Vec::new(),
        };
        let mut sums = Sums {
            compute_here: 0.0,
            compute_next: 0.0,
        };
        for v in (0..n).filter(|&v| self.latest[v] < stage) {
            forced[v / 64] |= 1 << (v % 64);
            sums = self.include(&mut state, stage, None, v, sums);
        }
        self.enumerate(&mut state, stage, 0, sums)?;
        // Renumbered fewest nodes first, by counting.
        let sizes: Vec<usize> = state.keys.iter().map(|key| key_count(key)).collect();
        let order = counting_order(&sizes, state.free.len() + 1);
        let mut renumbered = vec![0u32; order.len()];
        for (new, &old) in order.iter().enumerate() {
            renumbered[old] = new as u32;
        }
        let downs: Vec<(u32, u32)> = state
            .downs
            .iter()
            .map(|&(up, down)| (renumbered[up as usize], renumbered[down as usize]))
            .collect();
        let ups: Vec<usize> = downs.iter().map(|&(up, _)| up as usize).collect();
        let mut below_from = vec![0u32; order.len() + 1];
        for &up in &ups {
            below_from[up + 1] += 1;
        }
        for i in 1..below_from.len() {
            below_from[i] += below_from[i - 1];
        }
        let below = counting_order(&ups, order.len())
            .into_iter()
            .map(|pair| downs[pair].1)
            .collect();
        Ok(Region {
            keys: order.iter().map(|&id| state.keys[id]).collect(),
            figures: order.iter().map(|&id| state.figures[id]).collect(),
            free: state.free,
            forced,
            below_from,
            below,
            next_id: Vec::new(),
        })
    }

    /// Each free node's free successors, as a key.
    fn free_successors(&self, free: &[usize]) -> Vec<Key> {
        let mut slot = vec![NONE; self.problem.node_count()];
        for (i, &v) in free.iter().enumerate() {
            slot[v] = i as u32;
        }
        free.iter()
            .map(|&v| {
                let mut after: Key = [0; KEY_WORDS];
                for &s in &self.shape.succs[v] {
                    let j = slot[s as usize];
                    if j != NONE {
                        after[j as usize / 64] |= 1 << (j % 64);
                    }
                }
                after
            })
            .collect()
    }

    /// Enumerates the ideals that decide free nodes `i..` on top of `state`: each node joins
    /// (when its predecessors are in) or stays out. Nodes that cannot join are passed over in
    /// a loop: after a node is left out, its descendants are, and they are most of a region.
    ///
    /// The ideals one maximal node down come with the enumeration, without a lookup: where free
    /// node `i` joins, the ideals that hold it as a maximal node are those of the joining branch
    /// without any of its successors, and the leaving branch enumerates exactly those less `i`,
    /// with the same decisions after `i` and in the same order. So the two lists pair in order.
    fn enumerate(
        &mut self,
        state: &mut Enumeration,
        stage: usize,
        mut i: usize,
        sums: Sums,
    ) -> Result<(), NotBuilt> {
        if let Some(end) = self.tick() {
            return Err(NotBuilt::Stopped(end));
        }
        let preds = &self.shape.preds;
        let joinable =
            |v: usize, state: &Enumeration| preds[v].iter().all(|&p| state.inside[p as usize]);
        while state.free.get(i).is_some_and(|&v| !joinable(v, state)) {
            i += 1;
        }
        let Some(&v) = state.free.get(i) else {
            self.record(state, stage, sums);
            return Ok(());
        };
        let joining_from = state.keys.len();
        let joined = self.include(state, stage, Some(i), v, sums);
        let outcome = self.enumerate(state, stage, i + 1, joined);
        self.exclude(state, i, v);
        outcome?;
        let leaving_from = state.keys.len();
        self.enumerate(state, stage, i + 1, sums)?;
        let after = state.successors[i];
        let with_i_maximal = (joining_from..leaving_from)
            .filter(|&up| state.keys[up].iter().zip(&after).all(|(k, a)| k & a == 0));
        let mut down = leaving_from;
        for up in with_i_maximal {
            state.downs.push((up as u32, down as u32));
            down += 1;
        }
        debug_assert_eq!(down, state.keys.len(), "the two branches pair one to one");
        Ok(())
    }

    fn record(&self, state: &mut Enumeration, stage: usize, sums: Sums) {
        let problem = self.problem;
        state.keys.push(state.bits);
        state.figures.push(Figures {
            compute_here: sums.compute_here,
            compute_next: sums.compute_next,
            receive_here: problem.receive_secs(stage, state.messages, state.bytes),
            receive_next: problem.receive_secs(stage + 1, state.messages, state.bytes),
        });
    }

    /// Adds `v` (free node `slot`, or a forced one) to the enumerated ideal: its flows open, the
    /// flows whose last reader it is close (as [`Search::place`] counts them).
    fn include(
        &self,
        state: &mut Enumeration,
        stage: usize,
        slot: Option<usize>,
        v: usize,
        sums: Sums,
    ) -> Sums {
        let (problem, shape) = (self.problem, self.shape);
        state.inside[v] = true;
        if let Some(i) = slot {
            state.bits[i / 64] |= 1 << (i % 64);
        }
        for &f in &shape.flows_out[v] {
            state.messages += 1;
            state.bytes += problem.flows()[f as usize].bytes;
        }
        for &f in &shape.flows_in[v] {
            let flow = &problem.flows()[f as usize];
            state.readers_in[f as usize] += 1;
            if state.readers_in[f as usize] as usize == flow.consumers.len() {
                state.messages -= 1;
                state.bytes -= flow.bytes;
            }
        }
        Sums {
            compute_here: sums.compute_here + problem.node_secs(stage, v),
            compute_next: sums.compute_next + problem.node_secs(stage + 1, v),
        }
    }

    /// Undoes [`Self::include`] of free node `slot`, `v` (the sums come back by copy).
    fn exclude(&self, state: &mut Enumeration, slot: usize, v: usize) {
        let (problem, shape) = (self.problem, self.shape);
        state.inside[v] = false;
        state.bits[slot / 64] &= !(1 << (slot % 64));
        for &f in &shape.flows_out[v] {
            state.messages -= 1;
            state.bytes -= problem.flows()[f as usize].bytes;
        }
        for &f in &shape.flows_in[v] {
            let flow = &problem.flows()[f as usize];
            if state.readers_in[f as usize] as usize == flow.consumers.len() {
                state.messages += 1;
                state.bytes += flow.bytes;
            }
            state.readers_in[f as usize] -= 1;
        }
    }

    /// Per ideal of region `stage`, its id in the next region (`next_index`) when it holds
    /// every node whose latest stage is `stage`, or in the last region its own id when it
    /// leaves the last stage a node; [`NONE`] otherwise.
    fn next_ids(
        &self,
        regions: &[Region],
        next_index: Option<&KeyIndex>,
        stage: usize,
    ) -> Vec<u32> {
        let region = &regions[stage];
        let mut due: Key = [0; KEY_WORDS];
        for (i, &v) in region.free.iter().enumerate() {
            if self.latest[v] <= stage {
                due[i / 64] |= 1 << (i % 64);
            }
        }
        let holds_due = |key: &Key| key.iter().zip(&due).all(|(k, d)| k & d == *d);
        let Some((next, next_index)) = regions.get(stage + 1).zip(next_index) else {
            // The last region: the last stage must keep a node.
            let n = self.problem.node_count();
            let forced = key_count(&region.forced);
            return (0..region.len())
                .map(|id| {
                    let key = &region.keys[id];
                    match holds_due(key) && forced + key_count(key) < n {
                        true => id as u32,
                        false => NONE,
                    }
                })
                .collect();
        };
        // Each free node's bit in the next region's keys. The next region's other free nodes
        // have their earliest stage after this one, so no ideal here holds them.
        let mut slot = vec![NONE; self.problem.node_count()];
        for (j, &v) in next.free.iter().enumerate() {
            slot[v] = j as u32;
        }
        let moved: Vec<u32> = region.free.iter().map(|&v| slot[v]).collect();
        (0..region.len())
            .map(|id| {
                let key = &region.keys[id];
                if !holds_due(key) {
                    return NONE;
                }
                let mut next_key: Key = [0; KEY_WORDS];
                for i in ones(key) {
                    let j = moved[i];
                    if j != NONE {
                        next_key[j as usize / 64] |= 1 << (j % 64);
                    }
                }
                next_index.find(&next_key).map_or(NONE, |id| id as u32)
            })
            .collect()
    }
}

impl Lattice {
    /// A plan within `bound` by the search's sums, memory and pinned cuts aside; `None` when
    /// there is none, which proves that no plan is within it. `tick` counts the work and says
    /// when to stop.
    pub(super) fn sweep(
        &self,
        bound: f64,
        mut tick: impl FnMut() -> Option<SearchEnd>,
    ) -> Result<Option<Vec<StageId>>, SearchEnd> {
        let limit = bound * (1.0 + SUM_SLACK);
        let stages = self.regions.len() + 1;
        // Per region: each ideal's value as a prefix (receive less compute) where it is one,
        // and the least value of a prefix strictly inside each ideal, with that prefix's id.
        // Region 0's first ideal is the empty one.
        let mut as_prefix = vec![f64::INFINITY; self.regions[0].len()];
        let f = self.regions[0].figures[0];
        as_prefix[0] = f.receive_here - f.compute_here;
        let mut leasts: Vec<Vec<(f64, u32)>> = Vec::with_capacity(stages - 1);
        for (stage, region) in self.regions.iter().enumerate() {
            let last = stage + 2 == stages;
            let mut least = vec![(f64::INFINITY, NONE); region.len()];
            let mut next_prefix = match last {
                true => Vec::new(),
                false => vec![f64::INFINITY; self.regions[stage + 1].len()],
            };
            let mut reached = false;
            for id in 0..region.len() {
                if let Some(end) = tick() {
                    return Err(end);
                }
                let mut best = (f64::INFINITY, NONE);
                for &down in region.below(id) {
                    let down = down as usize;
                    if as_prefix[down] < best.0 {
                        best = (as_prefix[down], down as u32);
                    }
                    if least[down].0 < best.0 {
                        best = least[down];
                    }
                }
                least[id] = best;
                let next_id = region.next_id[id];
                if next_id == NONE || !best.0.is_finite() {
                    continue;
                }
                let f = region.figures[id];
                let gradient = if self.training { f.receive_next } else { 0.0 };
                if best.0 + f.compute_here + gradient > limit {
                    continue;
                }
                if last {
                    let rest = f.receive_next + (self.total_last_secs - f.compute_next);
                    if rest <= limit {
                        leasts.push(least);
                        return Ok(Some(self.plan_through(&leasts, id)));
                    }
                    continue;
                }
                reached = true;
                let g = self.regions[stage + 1].figures[next_id as usize];
                next_prefix[next_id as usize] = g.receive_here - g.compute_here;
            }
            if !reached {
                return Ok(None);
            }
            leasts.push(least);
            as_prefix = next_prefix;
        }
        Ok(None)
    }

    /// The plan whose prefix `P_{K−1}` is ideal `last` of the last region, read back through
    /// the least prefixes each region recorded.
    fn plan_through(&self, leasts: &[Vec<(f64, u32)>], last: usize) -> Vec<StageId> {
        let stages = self.regions.len() + 1;
        let mut stage_of = vec![StageId(stages as u32 - 1); self.node_count];
        // `id` is ideal P_{k+1} in region k's numbering.
        let mut id = last;
        for stage in (0..stages - 1).rev() {
            let region = &self.regions[stage];
            let nodes = region.nodes(id);
            for (v, stage_of) in stage_of.iter_mut().enumerate() {
                if nodes[v / 64] & (1 << (v % 64)) != 0 {
                    *stage_of = StageId(stage as u32);
                }
            }
            let prefix = leasts[stage][id].1 as usize;
            if stage > 0 {
                // The same prefix in the region before, where it was the ideal reached.
                let before = &self.regions[stage - 1];
                id = (0..before.len())
                    .find(|&b| before.next_id[b] as usize == prefix)
                    .expect("a prefix reached is an ideal of the region before");
            }
        }
        stage_of
    }
}

/// The indices of `keys` (each below `bound`) ordered by key, ties in index order.
fn counting_order(keys: &[usize], bound: usize) -> Vec<usize> {
    let mut starts = vec![0; bound + 1];
    for &key in keys {
        starts[key + 1] += 1;
    }
    for i in 1..starts.len() {
        starts[i] += starts[i - 1];
    }
    let mut order = vec![0; keys.len()];
    for (index, &key) in keys.iter().enumerate() {
        order[starts[key]] = index;
        starts[key] += 1;
    }
    order
}

fn key_count(key: &[u64]) -> usize {
    key.iter().map(|w| w.count_ones() as usize).sum()
}

/// The set bits of `key`, ascending.
fn ones(key: &[u64]) -> impl Iterator<Item = usize> + '_ {
    key.iter().enumerate().flat_map(|(w, &bits)| {
        let mut bits = bits;
        std::iter::from_fn(move || {
            (bits != 0).then(|| {
                let i = bits.trailing_zeros() as usize;
                bits &= bits - 1;
                w * 64 + i
            })
        })
    })
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::time::{Duration, Instant};

    use super::super::{Search, Shape};
    use super::{ones, Key};

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig { cases: 100, ..Default::default() })]

        /// The ideals below each ideal, paired during the enumeration, are exactly the ideal
        /// less each of its maximal nodes, found by key.
        #[test]
        fn the_ideals_below_are_each_ideal_less_a_maximal_node(
            n in 4usize..14,
            stages in 2usize..4,
            times in proptest::collection::vec(0.1f64..4.0, 14),
            edge_bits in proptest::collection::vec(proptest::prelude::any::<bool>(), 91),
        ) {
            let edges = crate::partition::bounds::tests::edges_from_bits(n, &edge_bits);
            let p = crate::partition::bounds::tests::dag(&times[..n], &edges, stages);
            let start = p.contiguous_assignment(&(0..stages).collect::<Vec<_>>());
            let shape = Shape::new(&p);
            let far = Instant::now() + Duration::from_secs(3600);
            let mut search = Search::new(&p, &shape, &start, far, None);
            proptest::prop_assume!(search.windows_feasible);
            let Ok(lattice) = search.build_lattice() else {
                return Err(proptest::test_runner::TestCaseError::fail("no lattice"));
            };
            for region in &lattice.regions {
                let by_key: HashMap<Key, usize> =
                    region.keys.iter().enumerate().map(|(id, key)| (*key, id)).collect();
                proptest::prop_assert_eq!(by_key.len(), region.len(), "keys are distinct");
                for (id, key) in region.keys.iter().enumerate() {
                    let mut expected: Vec<u32> = ones(key)
                        .filter(|&i| {
                            let v = region.free[i];
                            !shape.succs[v].iter().any(|&s| {
                                region.free.iter().position(|&f| f == s as usize)
                                    .is_some_and(|j| key[j / 64] & (1 << (j % 64)) != 0)
                            })
                        })
                        .map(|i| {
                            let mut down = *key;
                            down[i / 64] &= !(1 << (i % 64));
                            by_key[&down] as u32
                        })
                        .collect();
                    let mut found = region.below(id).to_vec();
                    expected.sort_unstable();
                    found.sort_unstable();
                    proptest::prop_assert_eq!(found, expected);
                    for &down in region.below(id) {
                        proptest::prop_assert!((down as usize) < id, "numbered fewest nodes first");
                    }
                }
            }
        }
    }
}
