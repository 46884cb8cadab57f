//! Which files each task of a stage scans: by bucket for bucketed tables,
//! by where the blocks are for other HDFS scans (see the end).
//!
//! A bucketed scan (`cirro-storage/src/bucket.rs`) declares `Hash(k, p)`:
//! its partition j holds the buckets b with b mod p = j, and a join or
//! aggregation above it relies on that. datafusion-distributed runs a stage
//! as T tasks, each with the stage's p partitions, and when the stage also
//! reads a hash shuffle, task t's partition j receives the rows whose hash
//! mod pT is t·p + j (the shuffle's producers split into pT partitions, and
//! consumer t takes the t-th run of p). So task t's partition j of a
//! bucketed scan must hold exactly those rows too:
//!
//! ```text
//!  n buckets, p partitions per task, T tasks, m = p·T
//!  m divides n:  task t, partition j  ←  the buckets b with b mod m = t·p + j
//!                (whole buckets: every bucket is read by one task, and bucket
//!                 b of every table scanned alike lands in the same task)
//!  otherwise:    task t, partition j  ←  the buckets b with b mod p = j, keeping
//!                the rows with cirro_hash_slot(m, k) in [t·p, t·p + p)
//! ```
//!
//! (`hash mod m = t·p + j` gives `hash mod p = j`, as p divides m, so the
//! partition's rows are within its buckets either way.) The first case
//! reads each file once; the second reads each file in every task that needs
//! part of it, which is why bucket counts should be multiples of the nodes
//! times the cores (the docs say so). The datafusion-distributed default
//! (files dealt round-robin over the tasks' partitions) would break the
//! declared partitioning, so this handler takes every scan that declares one.
//!
//! **Locality.** An unbucketed scan whose files carry their HDFS blocks
//! (`locality.rs`) is split by node: each file belongs to the live node
//! holding most of its bytes; the tasks are dealt to the nodes (the nodes
//! with the most bytes first; with fewer tasks than nodes, only those), a
//! node's files to its tasks, largest first to the emptiest. A file whose
//! node takes no task, or has no live node (its node died, its Cirro server
//! or its data node), goes where the work per task, weighted by the node's
//! load (running statements and tasks per core, plus the share of memory in
//! use, as the nodes report them to ZooKeeper), stays least. Every file is
//! marked with the node meant for its task ([`TaskNode`]); the router
//! (`distributed.rs`) sends the task there. Bucketed scans are not marked:
//! the router sends each of their tasks to the node holding most of its
//! bytes, so bucket b of every table scanned in a stage goes to one node.
//!
//! **Cache affinity.** Other scans split into several tasks (local storage,
//! S3, HDFS files without block locations) are split the same way, each file
//! range belonging to the node that rendezvous hashing picks for it
//! ([`affinity`]): the same range goes to the same node query after query,
//! from whichever node coordinates, so that each node's hot-data and disk
//! tiers hold a stable slice of the data; when a node joins or leaves, only
//! the ranges it gains or held move. A scan of one task stays where the
//! router puts it (the coordinator).

use std::sync::Arc;

use cirro_storage::bucket::FileBucket;
use datafusion::common::{Result, ScalarValue, internal_err};
use datafusion::datasource::listing::PartitionedFile;
use datafusion::datasource::physical_plan::{FileGroup, FileScanConfig};
use datafusion::datasource::source::DataSourceExec;
use datafusion::logical_expr::Operator;
use datafusion::physical_expr::expressions::{BinaryExpr, Literal};
use datafusion::physical_expr::{PhysicalExpr, ScalarFunctionExpr};
use datafusion::physical_plan::filter::FilterExec;
use datafusion::physical_plan::{ExecutionPlan, ExecutionPlanProperties, Partitioning};
use datafusion::prelude::SessionConfig;
use datafusion_distributed::{
    DistributedLeafExec, ScaleUpLeafNodeEvent, ScaleUpLeafNodeEventResponse, ScaleUpLeafNodeHandler,
};
use url::Url;

use crate::distributed::{ClusterWorkers, LiveNode};
use crate::locality::{Located, file_range};

/// The scale-up handler for file scans (see the module docs): scans that
/// declare a hash partitioning, and HDFS scans whose files carry their
/// blocks; None for other leaves (the default deals their files
/// round-robin).
pub(crate) struct ScanPlacement {
    pub(crate) workers: ClusterWorkers,
}

impl ScaleUpLeafNodeHandler for ScanPlacement {
    fn handle(&self, ev: ScaleUpLeafNodeEvent) -> Option<Result<ScaleUpLeafNodeEventResponse>> {
        let dse = ev.plan.downcast_ref::<DataSourceExec>()?;
        let scan = dse.data_source().downcast_ref::<FileScanConfig>()?;
        if scan.output_partitioning.is_some() {
            return bucketed_scan_tasks(&ev, scan);
        }
        let files: Vec<&PartitionedFile> = scan.file_groups.iter().flat_map(|g| g.iter()).collect();
        let located = files.iter().any(|f| f.extension::<Located>().is_some());
        if !located && ev.task_count <= 1 {
            return None;
        }
        let nodes = self.workers.live();
        let owners = if located {
            holders(&files, &nodes)
        } else {
            affinity(&files, &nodes).into_iter().map(Some).collect()
        };
        let variants = local_split(scan, &files, &owners, ev.task_count.max(1), &nodes);
        Some(
            DistributedLeafExec::try_new(Arc::clone(ev.plan), variants)
                .map(|leaf| ScaleUpLeafNodeEventResponse::new(Arc::new(leaf))),
        )
    }
}

/// The node a task's files were placed for (a `PartitionedFile`
/// extension of locality-split scans).
#[derive(Debug, Clone)]
pub(crate) struct TaskNode(pub(crate) Url);

/// Each file's node by its HDFS blocks: the live node holding most of its
/// bytes (None where no live node holds any).
fn holders(files: &[&PartitionedFile], nodes: &[LiveNode]) -> Vec<Option<usize>> {
    files
        .iter()
        .map(|file| {
            let (range, _) = file_range(file);
            file.extension::<Located>().and_then(|located| {
                nodes
                    .iter()
                    .enumerate()
                    .map(|(i, n)| (located.0.bytes_on(&n.host, range), i))
                    .filter(|(bytes, _)| *bytes > 0)
                    .max_by_key(|(bytes, i)| (*bytes, std::cmp::Reverse(*i)))
                    .map(|(_, i)| i)
            })
        })
        .collect()
}

/// How far above its share of the bytes (by cores) [`affinity`] lets a
/// node's slice grow before a range goes to its next choice.
const AFFINITY_SLACK: f64 = 1.05;

/// Each file range's node (an index into `nodes`), by rendezvous hashing
/// with bounded loads: every node scores a range by a hash of the two (a
/// fixed function, so every coordinator agrees), weighted by its cores;
/// ranges go, largest first, to the best-scoring node whose slice stays
/// within [`AFFINITY_SLACK`] of its share of the bytes, else to their best.
/// A range's order of nodes does not depend on the other nodes, so when a
/// node joins only the ranges it now wins move to it, and when one leaves
/// only its own move (give or take the few the bound pushes along).
fn affinity(files: &[&PartitionedFile], nodes: &[LiveNode]) -> Vec<usize> {
    let units: Vec<(String, u64)> = files
        .iter()
        .map(|file| {
            let (range, size) = file_range(file);
            let start = range.map_or(0, |(start, _)| start);
            (format!("{}@{start}", file.object_meta.location), size)
        })
        .collect();
    let keys: Vec<(String, f64)> = nodes
        .iter()
        .map(|n| (n.url.to_string(), n.cores.max(1.0)))
        .collect();
    rendezvous(&units, &keys)
}

/// [`affinity`] over `units` (key, bytes) and `nodes` (key, weight).
fn rendezvous(units: &[(String, u64)], nodes: &[(String, f64)]) -> Vec<usize> {
    if nodes.is_empty() {
        return vec![0; units.len()];
    }
    let total: f64 = units.iter().map(|(_, size)| *size as f64).sum();
    let weights: f64 = nodes.iter().map(|(_, w)| *w).sum();
    let caps: Vec<f64> = nodes
        .iter()
        .map(|(_, w)| total * w / weights * AFFINITY_SLACK)
        .collect();
    let mut order: Vec<usize> = (0..units.len()).collect();
    order.sort_by(|a, b| {
        units[*b]
            .1
            .cmp(&units[*a].1)
            .then(units[*a].0.cmp(&units[*b].0))
    });
    let mut held = vec![0f64; nodes.len()];
    let mut owner = vec![0usize; units.len()];
    for u in order {
        let (key, size) = &units[u];
        // Weighted rendezvous: -w / ln(h), h uniform in (0, 1).
        let mut ranked: Vec<(f64, usize)> = nodes
            .iter()
            .enumerate()
            .map(|(n, (node, weight))| {
                let h = (stable_hash(node, key) >> 11) as f64 / (1u64 << 53) as f64;
                (-weight / h.max(f64::MIN_POSITIVE).ln(), n)
            })
            .collect();
        ranked.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        let n = ranked
            .iter()
            .map(|(_, n)| *n)
            .find(|n| held[*n] + *size as f64 <= caps[*n])
            .unwrap_or(ranked[0].1);
        held[n] += *size as f64;
        owner[u] = n;
    }
    owner
}

/// A hash of a node's key and a range's key that every node computes
/// alike (FNV-1a, then SplitMix64's finalizer to spread the bits).
fn stable_hash(node: &str, unit: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in node.bytes().chain([0u8]).chain(unit.bytes()) {
        h ^= u64::from(byte);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h ^= h >> 30;
    h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h ^= h >> 27;
    h = h.wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

/// The per-task scans of a split by node (see the module docs): `owners`
/// gives each file's node (None: none).
fn local_split(
    scan: &FileScanConfig,
    files: &[&PartitionedFile],
    owners: &[Option<usize>],
    tasks: usize,
    nodes: &[LiveNode],
) -> Vec<Arc<dyn ExecutionPlan>> {
    // Each file's size and its node.
    let sized: Vec<(u64, Option<usize>)> = files
        .iter()
        .zip(owners)
        .map(|(file, owner)| (file_range(file).1, *owner))
        .collect();
    let mut owned = vec![0u64; nodes.len()];
    for (size, best) in &sized {
        if let Some(i) = best {
            owned[*i] += size;
        }
    }
    // The nodes that take tasks: most bytes first, then the least loaded.
    let mut order: Vec<usize> = (0..nodes.len()).collect();
    order.sort_by(|a, b| {
        owned[*b]
            .cmp(&owned[*a])
            .then(nodes[*a].load.total_cmp(&nodes[*b].load))
    });
    let task_node: Vec<usize> = (0..tasks).map(|t| order[t % order.len()]).collect();
    let mut tasks_of = vec![0usize; nodes.len()];
    for n in &task_node {
        tasks_of[*n] += 1;
    }
    // Largest files first, each to its node's emptiest task; files of no
    // task-taking node to the node whose weighted work per task stays least.
    let mut by_size: Vec<usize> = (0..files.len()).collect();
    by_size.sort_by_key(|i| std::cmp::Reverse(sized[*i].0));
    let (mine, rest): (Vec<usize>, Vec<usize>) = by_size
        .into_iter()
        .partition(|i| sized[*i].1.is_some_and(|n| tasks_of[n] > 0));
    let mut task_bytes = vec![0u64; tasks];
    let mut node_bytes = vec![0u64; nodes.len()];
    let mut task_files: Vec<Vec<usize>> = vec![Vec::new(); tasks];
    let mut place =
        |file: usize, node: usize, task_bytes: &mut Vec<u64>, node_bytes: &mut Vec<u64>| {
            let task = (0..tasks)
                .filter(|t| task_node[*t] == node)
                .min_by_key(|t| (task_bytes[*t], *t))
                .expect("the node takes a task");
            task_bytes[task] += sized[file].0;
            node_bytes[node] += sized[file].0;
            task_files[task].push(file);
        };
    for file in mine {
        let node = sized[file].1.expect("partitioned on it");
        place(file, node, &mut task_bytes, &mut node_bytes);
    }
    for file in rest {
        let node = (0..nodes.len())
            .filter(|n| tasks_of[*n] > 0)
            .min_by(|a, b| {
                let weighted = |n: usize| {
                    (node_bytes[n] + sized[file].0) as f64 / tasks_of[n] as f64
                        * (1.0 + nodes[n].load)
                };
                weighted(*a).total_cmp(&weighted(*b))
            })
            .expect("some node takes a task");
        place(file, node, &mut task_bytes, &mut node_bytes);
    }
    // Within a task, files to its partitions, largest first to the emptiest.
    let partitions = scan.file_groups.len().max(1);
    task_files
        .into_iter()
        .enumerate()
        .map(|(t, mine)| {
            let url = &nodes[task_node[t]].url;
            let mut groups: Vec<Vec<PartitionedFile>> = vec![Vec::new(); partitions];
            let mut sizes = vec![0u64; partitions];
            for file in mine {
                let p = (0..partitions)
                    .min_by_key(|p| (sizes[*p], *p))
                    .expect("partitions");
                sizes[p] += sized[file].0;
                groups[p].push(files[file].clone().with_extension(TaskNode(url.clone())));
            }
            scan_of(scan, groups)
        })
        .collect()
}

/// The per-task scans of a scan that declares a hash partitioning.
fn bucketed_scan_tasks(
    ev: &ScaleUpLeafNodeEvent,
    scan: &FileScanConfig,
) -> Option<Result<ScaleUpLeafNodeEventResponse>> {
    let Partitioning::Hash(keys, partitions) = ev.plan.output_partitioning().clone() else {
        // The key is not among the scan's columns: nothing above relies on
        // the partitioning, any split is right; but the default would keep
        // declaring it, so split here too, as one bucket-blind run.
        return Some(split(ev.plan, scan, None, ev.task_count, ev.session_config));
    };
    Some(split(
        ev.plan,
        scan,
        Some((&keys, partitions)),
        ev.task_count,
        ev.session_config,
    ))
}

/// The per-task scans of `plan` (see the module docs). Without `hash`
/// (keys and p), files are dealt to the tasks whole, round-robin.
fn split(
    plan: &Arc<dyn ExecutionPlan>,
    scan: &FileScanConfig,
    hash: Option<(&[Arc<dyn PhysicalExpr>], usize)>,
    tasks: usize,
    config: &SessionConfig,
) -> Result<ScaleUpLeafNodeEventResponse> {
    let files: Vec<&PartitionedFile> = scan.file_groups.iter().flat_map(|g| g.iter()).collect();
    let tasks = tasks.max(1);
    let variants = match hash {
        None => {
            let groups = scan.file_groups.len().max(1);
            (0..tasks)
                .map(|t| {
                    let mut mine: Vec<Vec<PartitionedFile>> = vec![Vec::new(); groups];
                    for (i, file) in files.iter().enumerate().filter(|(i, _)| i % tasks == t) {
                        mine[(i / tasks) % groups].push((*file).clone());
                    }
                    Ok(scan_of(scan, mine))
                })
                .collect::<Result<Vec<_>>>()?
        }
        Some((keys, partitions)) => {
            let mut buckets = Vec::with_capacity(files.len());
            for file in &files {
                let Some(bucket) = file.extension::<FileBucket>() else {
                    return internal_err!(
                        "a file of a hash-partitioned scan has no bucket: {}",
                        file.object_meta.location
                    );
                };
                buckets.push(*bucket);
            }
            let count = buckets.first().map(|b| b.buckets as usize).unwrap_or(1);
            let slots = partitions * tasks;
            let whole = count % slots == 0;
            (0..tasks)
                .map(|t| {
                    let mut mine: Vec<Vec<PartitionedFile>> = vec![Vec::new(); partitions];
                    for (file, bucket) in files.iter().zip(&buckets) {
                        let b = bucket.bucket as usize;
                        if !whole || (b % slots) / partitions == t {
                            mine[b % partitions].push((*file).clone());
                        }
                    }
                    let scan = scan_of(scan, mine);
                    if whole {
                        return Ok(scan);
                    }
                    let keep = slot_range(keys, slots, t * partitions, partitions, &scan, config)?;
                    Ok(Arc::new(FilterExec::try_new(keep, scan)?) as Arc<dyn ExecutionPlan>)
                })
                .collect::<Result<Vec<_>>>()?
        }
    };
    let leaf = DistributedLeafExec::try_new(Arc::clone(plan), variants)?;
    Ok(ScaleUpLeafNodeEventResponse::new(Arc::new(leaf)))
}

/// `scan` reading `groups` (one per partition).
fn scan_of(scan: &FileScanConfig, groups: Vec<Vec<PartitionedFile>>) -> Arc<dyn ExecutionPlan> {
    let mut config = scan.clone();
    config.file_groups = groups.into_iter().map(FileGroup::new).collect();
    DataSourceExec::from_data_source(config)
}

/// `cirro_hash_slot(slots, keys…) >= first AND … < first + count`.
fn slot_range(
    keys: &[Arc<dyn PhysicalExpr>],
    slots: usize,
    first: usize,
    count: usize,
    input: &Arc<dyn ExecutionPlan>,
    config: &SessionConfig,
) -> Result<Arc<dyn PhysicalExpr>> {
    let literal =
        |v: u64| Arc::new(Literal::new(ScalarValue::UInt64(Some(v)))) as Arc<dyn PhysicalExpr>;
    let mut args = vec![literal(slots as u64)];
    args.extend(keys.iter().cloned());
    let slot = Arc::new(ScalarFunctionExpr::try_new(
        cirro_exec::functions::slot::hash_slot_udf(),
        args,
        input.schema().as_ref(),
        Arc::clone(config.options()),
    )?) as Arc<dyn PhysicalExpr>;
    let slot = Arc::new(datafusion::physical_expr::expressions::CastExpr::new(
        slot,
        datafusion::arrow::datatypes::DataType::UInt64,
        None,
    )) as Arc<dyn PhysicalExpr>;
    let low = Arc::new(BinaryExpr::new(
        Arc::clone(&slot),
        Operator::GtEq,
        literal(first as u64),
    ));
    let high = Arc::new(BinaryExpr::new(
        slot,
        Operator::Lt,
        literal((first + count) as u64),
    ));
    Ok(Arc::new(BinaryExpr::new(low, Operator::And, high)))
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use datafusion::arrow::datatypes::Schema;
    use datafusion::datasource::physical_plan::{FileScanConfigBuilder, ParquetSource};
    use datafusion::execution::object_store::ObjectStoreUrl;

    use super::*;
    use crate::locality::FileBlocks;

    fn node(host: &str, load: f64) -> LiveNode {
        LiveNode {
            url: Url::parse(&format!("http://{host}:7000")).unwrap(),
            host: host.to_string(),
            load,
            cores: 2.0,
        }
    }

    /// A file of `size` bytes whose blocks are all on `host`.
    fn file(name: &str, size: u64, host: &str) -> PartitionedFile {
        PartitionedFile::new(name.to_string(), size)
            .with_extension(Located(Arc::new(FileBlocks::of(&[(0, size, &[host])]))))
    }

    fn scan(files: &[PartitionedFile], partitions: usize) -> FileScanConfig {
        let schema = Arc::new(Schema::empty());
        let mut groups = vec![Vec::new(); partitions];
        for (i, f) in files.iter().enumerate() {
            groups[i % partitions].push(f.clone());
        }
        FileScanConfigBuilder::new(
            ObjectStoreUrl::parse("hdfs://nn:8020").unwrap(),
            Arc::new(ParquetSource::new(schema)),
        )
        .with_file_groups(groups.into_iter().map(FileGroup::new).collect())
        .build()
    }

    /// Per task: the files it scans (names) and the node it is meant for.
    fn split(
        files: &[PartitionedFile],
        tasks: usize,
        nodes: &[LiveNode],
    ) -> Vec<(Vec<String>, Option<String>)> {
        let config = scan(files, 2);
        let refs: Vec<&PartitionedFile> =
            config.file_groups.iter().flat_map(|g| g.iter()).collect();
        local_split(&config, &refs, &holders(&refs, nodes), tasks, nodes)
            .iter()
            .map(|variant| {
                let scan = variant
                    .downcast_ref::<DataSourceExec>()
                    .and_then(|d| d.data_source().downcast_ref::<FileScanConfig>())
                    .expect("a file scan");
                assert_eq!(scan.file_groups.len(), 2, "the scan's partitions are kept");
                let mut names = Vec::new();
                let mut meant = None;
                for f in scan.file_groups.iter().flat_map(|g| g.iter()) {
                    names.push(f.object_meta.location.to_string());
                    let host = f
                        .extension::<TaskNode>()
                        .expect("marked")
                        .0
                        .host_str()
                        .unwrap()
                        .to_string();
                    assert!(
                        meant.as_ref().is_none_or(|m| m == &host),
                        "one node per task"
                    );
                    meant = Some(host);
                }
                names.sort();
                (names, meant)
            })
            .collect()
    }

    #[test]
    fn each_node_scans_the_files_it_holds_and_a_dead_nodes_go_to_the_least_loaded() {
        let nodes = [node("a", 0.0), node("b", 3.0), node("c", 0.0)];
        let mut files = Vec::new();
        for (i, host) in ["a", "b", "c", "a", "b", "c", "a", "b", "c"]
            .iter()
            .enumerate()
        {
            files.push(file(&format!("{host}{i}"), 100 + i as u64, host));
        }
        // Two files on a node that is gone.
        files.push(file("d1", 500, "d"));
        files.push(file("d2", 400, "d"));
        let tasks = split(&files, 3, &nodes);
        let mut seen: HashMap<String, usize> = HashMap::new();
        for (names, meant) in &tasks {
            let meant = meant.clone().expect("every task has files");
            for name in names {
                *seen.entry(name.clone()).or_default() += 1;
                if !name.starts_with('d') {
                    assert!(name.starts_with(&meant), "{name} is scanned on {meant}");
                }
            }
            // The busy node b takes no file of the dead node.
            if meant == "b" {
                assert!(names.iter().all(|n| !n.starts_with('d')), "{names:?}");
            }
        }
        assert_eq!(seen.len(), files.len());
        assert!(seen.values().all(|n| *n == 1), "each file once: {seen:?}");
        // a and c take one each (the larger to either, then the other).
        let dead: Vec<&Option<String>> = tasks
            .iter()
            .filter(|(names, _)| names.iter().any(|n| n.starts_with('d')))
            .map(|(_, meant)| meant)
            .collect();
        assert_eq!(dead.len(), 2, "{tasks:?}");
    }

    #[test]
    fn fewer_tasks_than_nodes_go_to_the_nodes_holding_most() {
        let nodes = [node("a", 0.0), node("b", 0.0), node("c", 0.0)];
        let files = [
            file("a1", 1000, "a"),
            file("a2", 50, "a"),
            file("b1", 10, "b"),
            file("c1", 800, "c"),
            file("c2", 100, "c"),
        ];
        let tasks = split(&files, 2, &nodes);
        let meant: Vec<String> = tasks.iter().filter_map(|(_, m)| m.clone()).collect();
        assert_eq!(meant, ["a", "c"], "{tasks:?}");
        let all: usize = tasks.iter().map(|(n, _)| n.len()).sum();
        assert_eq!(all, 5);
        // More tasks than nodes: the node with the most bytes takes two.
        let tasks = split(&files, 4, &nodes);
        let on_a = tasks
            .iter()
            .filter(|(_, m)| m.as_deref() == Some("a"))
            .count();
        assert_eq!(on_a, 2, "{tasks:?}");
    }

    /// Rendezvous keys of `n` equal ranges and of nodes named `names`.
    fn ranges(n: usize) -> Vec<(String, u64)> {
        (0..n)
            .map(|i| (format!("t/part-{i:05}.parquet@0"), 1000))
            .collect()
    }

    fn weighted(names: &[&str]) -> Vec<(String, f64)> {
        names
            .iter()
            .map(|n| (format!("http://{n}:7000/"), 2.0))
            .collect()
    }

    fn owners_by_name(units: &[(String, u64)], names: &[&str]) -> Vec<String> {
        rendezvous(units, &weighted(names))
            .into_iter()
            .map(|n| names[n].to_string())
            .collect()
    }

    #[test]
    fn a_membership_change_moves_only_the_share_of_the_node_that_came_or_went() {
        let units = ranges(1000);
        let three = owners_by_name(&units, &["a", "b", "c"]);
        // Balanced: each node within the bound of its third.
        for name in ["a", "b", "c"] {
            let held = three.iter().filter(|o| *o == name).count();
            assert!((300..=350).contains(&held), "{name} holds {held}");
        }
        // Stable: the same answer every time, in any order of the nodes.
        assert_eq!(three, owners_by_name(&units, &["a", "b", "c"]));
        assert_eq!(three, owners_by_name(&units, &["c", "a", "b"]));
        // A fourth node joins: at most 1/4 + 5 % of the ranges move, and
        // (nearly) all of those to it.
        let four = owners_by_name(&units, &["a", "b", "c", "d"]);
        let moved: Vec<usize> = (0..units.len()).filter(|i| three[*i] != four[*i]).collect();
        assert!(moved.len() <= 300, "{} of 1000 moved", moved.len());
        let to_d = moved.iter().filter(|i| four[**i] == "d").count();
        assert!(
            to_d * 100 >= moved.len() * 95,
            "{to_d} of {} went to d",
            moved.len()
        );
        // c leaves: at most 1/3 + 5 % move, (nearly) all of them c's.
        let two = owners_by_name(&units, &["a", "b"]);
        let moved: Vec<usize> = (0..units.len()).filter(|i| three[*i] != two[*i]).collect();
        assert!(moved.len() <= 383, "{} of 1000 moved", moved.len());
        let from_c = moved.iter().filter(|i| three[**i] == "c").count();
        assert!(
            from_c * 100 >= moved.len() * 95,
            "{from_c} of {} were c's",
            moved.len()
        );
    }

    #[test]
    fn a_few_ranges_are_dealt_evenly() {
        let units = ranges(6);
        let owners = owners_by_name(&units, &["a", "b", "c"]);
        for name in ["a", "b", "c"] {
            assert_eq!(
                owners.iter().filter(|o| *o == name).count(),
                2,
                "{owners:?}"
            );
        }
    }
}
