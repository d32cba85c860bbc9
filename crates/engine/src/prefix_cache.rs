//! The prefix cache of the hybrid model (docs/prefix-cache.md): a radix tree over prompt token ids
//! whose nodes own whole KV pages and, where one was taken, a snapshot of every GDN layer's state
//! (conv window + recurrent state) at the node's last token, kept in a slot of the state pool.
//!
//! The tree only hands out ids: it never touches memory. KV pages are reference counted by the
//! scheduler (the tree holds one reference per page it owns, every sequence one per page of its
//! block table), so a page shared by the tree and running sequences is freed by whoever lets go
//! last. Edges are runs of whole pages, so a shared page is always full and never written again.
//!
//! Where a request may resume is decided by `SnapshotGrid`: only at page boundaries whose offset
//! inside the prefill chunk the kernels would compute the same way had the prefill not been cut
//! there, so that a cached hit never changes a bit of the output.

use std::collections::HashMap;

/// Settings of the prefix cache (`--disable-radix-cache`, `--mamba-track-interval`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PrefixCacheConfig {
    pub enabled: bool,
    /// Also snapshot every this many prompt tokens during prefill (SGLang's
    /// `--mamba-track-interval`); 0 turns interval snapshots off.
    pub track_interval: usize,
    /// Tokens that open a chat message (`<|im_start|>`): the last one in a prompt marks the end of
    /// its last complete message, where the next turn of a conversation diverges, and a snapshot is
    /// taken there. Empty: no divergence-point snapshots (interval ones only).
    pub boundary_tokens: Vec<u32>,
}

impl Default for PrefixCacheConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            track_interval: DEFAULT_TRACK_INTERVAL,
            boundary_tokens: Vec::new(),
        }
    }
}

impl PrefixCacheConfig {
    pub fn disabled() -> Self {
        Self {
            enabled: false,
            ..Self::default()
        }
    }
}

/// SGLang's default `--mamba-track-interval`.
pub const DEFAULT_TRACK_INTERVAL: usize = 256;

/// Token rows of one chunk of the chunked gated delta rule in every backend (docs/model.md): a
/// prefill cut at a multiple of it inside a step leaves the chunking of the rest unchanged.
pub const GDN_CHUNK: usize = 64;

/// Where a prefill may be cut (to take a snapshot, or to resume from one) without changing a bit
/// of what the kernels compute. Uncut, a prompt runs in steps `[k*chunk, (k+1)*chunk)`; inside a
/// step the gated delta rule runs in 64-token chunks from the step's start (a 1-token step runs
/// the recurrent form instead) and the CPU attention groups `64 / gqa_group` queries per work item
/// from the step's start. A cut at an offset inside the step that is a multiple of both leaves
/// every chunk and item as it was.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SnapshotGrid {
    pub page: usize,
    pub chunk: usize,
    /// Offsets inside a prefill step where a cut is exact.
    pub step_grid: usize,
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

impl SnapshotGrid {
    pub fn new(page: usize, chunk: usize, q_heads: usize, kv_heads: usize) -> Self {
        let group = (q_heads / kv_heads.max(1)).max(1);
        let rows_per_item = (GDN_CHUNK / group).max(1);
        let step_grid = GDN_CHUNK / gcd(GDN_CHUNK, rows_per_item) * rows_per_item;
        Self {
            page: page.max(1),
            chunk: chunk.max(1),
            step_grid,
        }
    }

    /// Whether a sequence of `n` tokens may be cut at position `p` (snapshot there, or resume
    /// there with `[0, p)` cached) and still compute exactly what an uncut prefill computes.
    pub fn allows(&self, p: usize, n: usize) -> bool {
        if p == 0
            || p >= n
            || !p.is_multiple_of(self.page)
            || !(p % self.chunk).is_multiple_of(self.step_grid)
        {
            return false;
        }
        // A 1-token step runs the recurrent form where the uncut step ran a 1-token chunk.
        let step_end = n.min((p / self.chunk + 1) * self.chunk);
        p.is_multiple_of(self.chunk) || step_end - p >= 2
    }

    /// The largest allowed position at or below `p`, if any.
    pub fn floor(&self, p: usize, n: usize) -> Option<usize> {
        let mut q = p.min(n.saturating_sub(1)) / self.page * self.page;
        while q > 0 {
            if self.allows(q, n) {
                return Some(q);
            }
            q -= self.page;
        }
        None
    }
}

/// Snapshot positions of a prompt of `tokens` (ascending): the end of its last complete message
/// (where the next turn of its conversation diverges), the end of its first message (the system
/// prompt and tool definitions other conversations share) and every `track_interval` tokens, each
/// moved down to the nearest allowed position.
pub fn snapshot_points(
    config: &PrefixCacheConfig,
    grid: &SnapshotGrid,
    tokens: &[u32],
) -> Vec<usize> {
    let n = tokens.len();
    let mut points = Vec::new();
    if config.track_interval > 0 {
        let mut p = config.track_interval;
        while p < n {
            points.extend(grid.floor(p, n));
            p += config.track_interval;
        }
    }
    let starts = || {
        tokens
            .iter()
            .enumerate()
            .filter(|(_, t)| config.boundary_tokens.contains(t))
            .map(|(i, _)| i)
    };
    if let Some(last) = starts().next_back() {
        points.extend(grid.floor(last, n));
    }
    if let Some(second) = starts().nth(1) {
        points.extend(grid.floor(second, n));
    }
    points.sort_unstable();
    points.dedup();
    points
}

/// Where a request can resume: the deepest node on its prefix that has a snapshot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PrefixMatch {
    pub node: usize,
    /// Tokens covered: the node's end position.
    pub len: usize,
    /// The KV pages of positions `0..len`, to share.
    pub pages: Vec<u32>,
    /// The state-pool slot holding the GDN state after `len` tokens.
    pub snapshot: u32,
}

/// What the tree gives back when it lets go of a node (or of its snapshot).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Released {
    pub pages: Vec<u32>,
    pub slots: Vec<u32>,
}

impl Released {
    fn absorb(&mut self, other: Released) {
        self.pages.extend(other.pages);
        self.slots.extend(other.slots);
    }
}

#[derive(Debug)]
struct Snapshot {
    slot: u32,
    /// The token after the node's last one in the request that took the snapshot: the MTP cache
    /// of the node's last position pairs that position with it.
    next_token: u32,
}

#[derive(Debug)]
struct Node {
    parent: usize,
    /// The edge from the parent: whole pages of tokens.
    tokens: Vec<u32>,
    pages: Vec<u32>,
    /// Children by the first page of their edge.
    children: HashMap<Vec<u32>, usize>,
    /// Position after the node's last token.
    end: usize,
    snapshot: Option<Snapshot>,
    last_use: u64,
    /// Admissions in flight that will copy this node's snapshot: never evicted while > 0.
    lock: usize,
}

/// The radix tree. Node 0 is the root (empty, never evicted).
#[derive(Debug)]
pub struct PrefixTree {
    nodes: Vec<Option<Node>>,
    free: Vec<usize>,
    page: usize,
    clock: u64,
    pages_held: usize,
    snapshots_held: usize,
}

impl PrefixTree {
    pub fn new(page: usize) -> Self {
        let root = Node {
            parent: 0,
            tokens: Vec::new(),
            pages: Vec::new(),
            children: HashMap::new(),
            end: 0,
            snapshot: None,
            last_use: 0,
            lock: 0,
        };
        Self {
            nodes: vec![Some(root)],
            free: Vec::new(),
            page: page.max(1),
            clock: 0,
            pages_held: 0,
            snapshots_held: 0,
        }
    }

    /// KV pages the tree holds a reference on.
    pub fn pages_held(&self) -> usize {
        self.pages_held
    }

    /// Every KV page the tree owns.
    pub fn pages(&self) -> impl Iterator<Item = u32> + '_ {
        self.nodes
            .iter()
            .flatten()
            .flat_map(|n| n.pages.iter().copied())
    }

    /// State slots holding snapshots.
    pub fn snapshots_held(&self) -> usize {
        self.snapshots_held
    }

    /// Nodes besides the root.
    pub fn len(&self) -> usize {
        self.nodes.iter().skip(1).filter(|n| n.is_some()).count()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn node(&self, id: usize) -> &Node {
        self.nodes[id].as_ref().expect("a live node")
    }

    fn node_mut(&mut self, id: usize) -> &mut Node {
        self.nodes[id].as_mut().expect("a live node")
    }

    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    /// Marks `id` and its ancestors as just used.
    fn touch(&mut self, mut id: usize) {
        let now = self.tick();
        loop {
            self.node_mut(id).last_use = now;
            if id == 0 {
                break;
            }
            id = self.node(id).parent;
        }
    }

    /// Whole pages of `tokens[pos..]` shared with `edge`, in tokens.
    fn common_pages(&self, edge: &[u32], tokens: &[u32]) -> usize {
        let mut k = 0;
        while k + self.page <= edge.len()
            && k + self.page <= tokens.len()
            && edge[k..k + self.page] == tokens[k..k + self.page]
        {
            k += self.page;
        }
        k
    }

    /// The deepest node on `tokens`' prefix with a snapshot that `accept(end, next_token)` takes.
    /// Marks the matched path as used.
    pub fn match_prefix(
        &mut self,
        tokens: &[u32],
        accept: impl Fn(usize, u32) -> bool,
    ) -> Option<PrefixMatch> {
        let mut cur = 0;
        let mut pos = 0;
        let mut pages = Vec::new();
        let mut best: Option<PrefixMatch> = None;
        while pos + self.page <= tokens.len() {
            let Some(&child) = self.node(cur).children.get(&tokens[pos..pos + self.page]) else {
                break;
            };
            let node = self.node(child);
            if self.common_pages(&node.tokens, &tokens[pos..]) < node.tokens.len() {
                break;
            }
            pages.extend_from_slice(&node.pages);
            pos += node.tokens.len();
            if let Some(s) = &node.snapshot {
                if accept(pos, s.next_token) {
                    best = Some(PrefixMatch {
                        node: child,
                        len: pos,
                        pages: pages.clone(),
                        snapshot: s.slot,
                    });
                }
            }
            cur = child;
        }
        if let Some(m) = &best {
            self.touch(m.node);
        }
        best
    }

    pub fn lock(&mut self, id: usize) {
        self.node_mut(id).lock += 1;
    }

    pub fn unlock(&mut self, id: usize) {
        if let Some(node) = self.nodes.get_mut(id).and_then(Option::as_mut) {
            node.lock = node.lock.saturating_sub(1);
        }
    }

    /// Whether `tokens[..end]` already ends at a node with a snapshot (then inserting it again
    /// would take a slot for nothing). Marks it as used when it does.
    pub fn has_snapshot_at(&mut self, tokens: &[u32], end: usize) -> bool {
        let mut cur = 0;
        let mut pos = 0;
        while pos < end {
            let Some(&child) = self
                .node(cur)
                .children
                .get(&tokens[pos..(pos + self.page).min(end)])
            else {
                return false;
            };
            let node = self.node(child);
            if pos + node.tokens.len() > end
                || self.common_pages(&node.tokens, &tokens[pos..end]) < node.tokens.len()
            {
                return false;
            }
            pos += node.tokens.len();
            cur = child;
        }
        if self.node(cur).snapshot.is_some() {
            self.touch(cur);
            true
        } else {
            false
        }
    }

    /// Inserts `tokens[..end]` (`end` a multiple of the page size) with the KV pages `pages`
    /// (those of the inserting sequence, covering `0..end`) and a snapshot in `slot` taken after
    /// `end` tokens. Returns the pages the tree took a new reference on; `slot` is kept unless
    /// the node already had a snapshot, in which case it is returned in `Released`.
    pub fn insert(
        &mut self,
        tokens: &[u32],
        end: usize,
        pages: &[u32],
        slot: u32,
    ) -> (Vec<u32>, Released) {
        debug_assert!(end.is_multiple_of(self.page));
        debug_assert!(pages.len() * self.page >= end);
        let next_token = tokens.get(end).copied().unwrap_or(u32::MAX);
        let mut taken = Vec::new();
        let mut cur = 0;
        let mut pos = 0;
        while pos < end {
            let key = tokens[pos..pos + self.page].to_vec();
            let Some(&child) = self.node(cur).children.get(&key) else {
                let id = self.add_node(
                    cur,
                    tokens[pos..end].to_vec(),
                    pages[pos / self.page..end / self.page].to_vec(),
                );
                taken.extend_from_slice(&self.node(id).pages);
                cur = id;
                break;
            };
            let edge_len = self.node(child).tokens.len();
            let common = self.common_pages(&self.node(child).tokens, &tokens[pos..end]);
            if common < edge_len {
                self.split(child, common);
            }
            pos += common;
            cur = child;
        }
        let mut released = Released::default();
        let node = self.node_mut(cur);
        if node.snapshot.is_some() || cur == 0 {
            released.slots.push(slot);
        } else {
            node.snapshot = Some(Snapshot { slot, next_token });
            self.snapshots_held += 1;
        }
        self.touch(cur);
        (taken, released)
    }

    fn add_node(&mut self, parent: usize, tokens: Vec<u32>, pages: Vec<u32>) -> usize {
        let end = self.node(parent).end + tokens.len();
        self.pages_held += pages.len();
        let key = tokens[..self.page].to_vec();
        let node = Node {
            parent,
            tokens,
            pages,
            children: HashMap::new(),
            end,
            snapshot: None,
            last_use: self.clock,
            lock: 0,
        };
        let id = self.store(node);
        self.node_mut(parent).children.insert(key, id);
        id
    }

    /// Puts `node` in a free slot of the arena (or a new one) and returns its id.
    fn store(&mut self, node: Node) -> usize {
        match self.free.pop() {
            Some(id) => {
                self.nodes[id] = Some(node);
                id
            }
            None => {
                self.nodes.push(Some(node));
                self.nodes.len() - 1
            }
        }
    }

    /// Splits `id`'s edge after `at` tokens: `id` keeps the first part (and becomes the parent of
    /// a new node with the rest, its children and its snapshot).
    fn split(&mut self, id: usize, at: usize) {
        debug_assert!(at > 0 && at.is_multiple_of(self.page));
        let page = self.page;
        let node = self.node_mut(id);
        let tail_tokens = node.tokens.split_off(at);
        let tail_pages = node.pages.split_off(at / page);
        let children = std::mem::take(&mut node.children);
        let snapshot = node.snapshot.take();
        let (end, last_use) = (node.end, node.last_use);
        node.end -= tail_tokens.len();
        let key = tail_tokens[..self.page].to_vec();
        let tail = Node {
            parent: id,
            tokens: tail_tokens,
            pages: tail_pages,
            children,
            end,
            snapshot,
            last_use,
            // Locks live only between planning and the next forward, never across an insert.
            lock: 0,
        };
        let tail_id = self.store(tail);
        let grandchildren: Vec<usize> = self.node(tail_id).children.values().copied().collect();
        for g in grandchildren {
            self.node_mut(g).parent = tail_id;
        }
        self.node_mut(id).children.insert(key, tail_id);
    }

    /// Removes leaf `id` and then every ancestor that became a leaf without a snapshot.
    fn remove_leaf(&mut self, mut id: usize) -> Released {
        let mut released = Released::default();
        while id != 0 {
            let node = self.node(id);
            if !node.children.is_empty() || node.lock > 0 {
                break;
            }
            let node = self.nodes[id].take().expect("a live node");
            self.free.push(id);
            self.pages_held -= node.pages.len();
            released.pages.extend(node.pages);
            if let Some(s) = node.snapshot {
                self.snapshots_held -= 1;
                released.slots.push(s.slot);
            }
            let parent = node.parent;
            let page = self.page;
            self.node_mut(parent).children.remove(&node.tokens[..page]);
            id = parent;
            if self.node(id).snapshot.is_some() {
                break;
            }
        }
        released
    }

    /// Evicts the least recently used unlocked leaf (its pages and snapshot). None when nothing
    /// can be evicted.
    pub fn evict_leaf(&mut self) -> Option<Released> {
        let victim = self
            .nodes
            .iter()
            .enumerate()
            .skip(1)
            .filter_map(|(i, n)| n.as_ref().map(|n| (i, n)))
            .filter(|(_, n)| n.children.is_empty() && n.lock == 0)
            .min_by_key(|(_, n)| n.last_use)
            .map(|(i, _)| i)?;
        Some(self.remove_leaf(victim))
    }

    /// Evicts the least recently used unlocked snapshot; its node keeps its pages (matched only
    /// up to an ancestor with a snapshot), or goes when it is a leaf.
    pub fn evict_snapshot(&mut self) -> Option<Released> {
        let victim = self
            .nodes
            .iter()
            .enumerate()
            .skip(1)
            .filter_map(|(i, n)| n.as_ref().map(|n| (i, n)))
            .filter(|(_, n)| n.snapshot.is_some() && n.lock == 0)
            .min_by_key(|(_, n)| n.last_use)
            .map(|(i, _)| i)?;
        let node = self.node_mut(victim);
        let slot = node.snapshot.take().expect("a snapshot").slot;
        self.snapshots_held -= 1;
        let mut released = Released {
            pages: Vec::new(),
            slots: vec![slot],
        };
        if self.node(victim).children.is_empty() {
            released.absorb(self.remove_leaf(victim));
        }
        Some(released)
    }

    /// Lets go of every unlocked node.
    pub fn flush(&mut self) -> Released {
        let mut released = Released::default();
        while let Some(r) = self.evict_leaf() {
            released.absorb(r);
        }
        released
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn toks(n: usize, seed: u32) -> Vec<u32> {
        (0..n as u32).map(|i| i * 7 + seed).collect()
    }

    #[test]
    fn grid_allows_only_exact_cuts() {
        let g = SnapshotGrid::new(16, 256, 4, 2);
        assert_eq!(g.step_grid, 64);
        assert!(g.allows(64, 200));
        assert!(!g.allows(48, 200), "not a multiple of the GDN chunk");
        assert!(
            !g.allows(64, 65),
            "would leave a 1-token step inside a chunk"
        );
        assert!(g.allows(256, 257), "a chunk boundary is a cut anyway");
        assert!(!g.allows(64, 64), "at least one token must be left to run");
        assert_eq!(g.floor(130, 400), Some(128));
        assert_eq!(g.floor(63, 400), None);
        // A GQA group of 6 (Qwen3.6-27B): 10 queries per attention item; only chunk starts.
        let g6 = SnapshotGrid::new(16, 256, 24, 4);
        assert_eq!(g6.step_grid, 320);
        assert!(!g6.allows(64, 1000));
        assert!(g6.allows(256, 1000));
    }

    #[test]
    fn snapshot_points_at_the_last_message_and_every_interval() {
        let g = SnapshotGrid::new(16, 256, 4, 2);
        let config = PrefixCacheConfig {
            enabled: true,
            track_interval: 256,
            boundary_tokens: vec![9999],
        };
        let mut t = toks(700, 1);
        t[0] = 9999;
        t[200] = 9999;
        t[300] = 9999;
        t[650] = 9999;
        // First message ends at 200 (-> 192), the last at 650 (-> 640), intervals at 256, 512.
        assert_eq!(snapshot_points(&config, &g, &t), vec![192, 256, 512, 640]);
    }

    #[test]
    fn match_insert_split_and_evict() {
        let mut tree = PrefixTree::new(4);
        let a = toks(16, 0);
        let pages_a: Vec<u32> = (0..4).collect();
        let (taken, rel) = tree.insert(&a, 12, &pages_a, 100);
        assert_eq!(taken, vec![0, 1, 2]);
        assert!(rel.slots.is_empty());
        // Same prefix of 8 then different: splits the edge at 8.
        let mut b = a.clone();
        b[9] = 5000;
        let (taken, _) = tree.insert(&b, 12, &[10, 11, 12], 101);
        assert_eq!(taken, vec![12], "shares the first two pages");
        assert_eq!(tree.pages_held(), 4);
        let m = tree.match_prefix(&a, |_, _| true).unwrap();
        assert_eq!(
            (m.len, m.snapshot, m.pages.clone()),
            (12, 100, vec![0, 1, 2])
        );
        // A snapshot at the split point.
        let (taken, _) = tree.insert(&b, 8, &[10, 11], 102);
        assert!(taken.is_empty());
        let mut c = a.clone();
        c[10] = 7777;
        let m = tree.match_prefix(&c, |_, _| true).unwrap();
        assert_eq!((m.len, m.snapshot), (8, 102));
        assert!(tree.has_snapshot_at(&a, 12));
        assert!(!tree.has_snapshot_at(&a, 4));
        // LRU: `a`'s leaf was used last, so `b`'s goes first.
        tree.match_prefix(&a, |_, _| true);
        let r = tree.evict_leaf().unwrap();
        assert_eq!(
            r,
            Released {
                pages: vec![12],
                slots: vec![101]
            }
        );
        // Locked nodes stay.
        let m = tree.match_prefix(&a, |_, _| true).unwrap();
        tree.lock(m.node);
        let r = tree.evict_leaf();
        assert!(r.is_none() || !r.unwrap().slots.contains(&100));
        tree.unlock(m.node);
        let all = tree.flush();
        assert!(tree.is_empty());
        assert_eq!(tree.pages_held(), 0);
        assert_eq!(tree.snapshots_held(), 0);
        let _ = all;
    }

    #[test]
    fn evicting_a_snapshot_keeps_pages_of_inner_nodes() {
        let mut tree = PrefixTree::new(4);
        let a = toks(20, 3);
        tree.insert(&a, 8, &[0, 1], 50);
        tree.insert(&a, 16, &[0, 1, 2, 3], 51);
        // The older snapshot is the inner node's: evicting it keeps the pages.
        let r = tree.evict_snapshot().unwrap();
        assert_eq!(
            r,
            Released {
                pages: vec![],
                slots: vec![50]
            }
        );
        assert_eq!(tree.pages_held(), 4);
        let m = tree.match_prefix(&a, |_, _| true).unwrap();
        assert_eq!(m.len, 16);
        // Refusing the deepest (e.g. MTP pairing token differs) falls back to none.
        assert!(tree.match_prefix(&a, |end, _| end < 16).is_none());
        let r = tree.evict_snapshot().unwrap();
        assert_eq!(r.slots, vec![51]);
        assert_eq!(
            r.pages.len(),
            4,
            "a leaf without a snapshot goes, and its bare parent"
        );
        assert!(tree.is_empty());
    }
}
