//! The spilled path of the spilling hash join: partitioning both sides to
//! spill files by a hash of the join keys, joining part by part, splitting a
//! part again when its build side still does not fit, and joining the build
//! side of a part that cannot be split (one key) in chunks.

use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, BooleanArray, BooleanBufferBuilder, UInt32Array, UInt64Array, new_null_array,
};
use arrow::compute::{filter_record_batch, take_record_batch};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use arrow::record_batch::RecordBatch;
use datafusion::common::hash_utils::{RandomState, create_hashes};
use datafusion::common::{JoinType, NullEquality, Result};
use datafusion::execution::SpillFile;
use datafusion::execution::memory_pool::MemoryLimit;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::PhysicalExprRef;
use datafusion::physical_plan::joins::utils::{JoinFilter, build_join_schema};
use datafusion::physical_plan::joins::{HashJoinExecBuilder, PartitionMode};
use datafusion::physical_plan::metrics::{Count, SpillMetrics};
use datafusion::physical_plan::spill::SpillManager;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::streaming::{PartitionStream, StreamingTableExec};
use futures::future::BoxFuture;
use futures::stream::BoxStream;
use futures::{FutureExt, StreamExt, TryStreamExt};

use super::tee::out_of_memory;

/// Parts the first split makes.
pub(super) const FANOUT_FIRST: usize = 32;
/// Parts each further split of one part makes.
const FANOUT_NEXT: usize = 8;
/// Splits at most (32 · 8³ = 16,384 parts); past them a part is joined in
/// chunks.
const LEVELS_MAX: u32 = 4;
/// The least a part's (or a chunk's) build rows may take in memory.
const PART_BYTES_MIN: usize = 64 << 10;
/// The name of the probe rows' numbers in the chunked join.
const ROW_ID: &str = "__cirro_probe_row";

/// What the spilled path needs of the join it replaces.
#[derive(Debug)]
pub(super) struct JoinSpec {
    pub on: Vec<(PhysicalExprRef, PhysicalExprRef)>,
    pub filter: Option<JoinFilter>,
    pub join_type: JoinType,
    pub projection: Option<Vec<usize>>,
    pub null_equality: NullEquality,
    /// The build (left) and probe (right) inputs' schemas.
    pub build_schema: SchemaRef,
    pub probe_schema: SchemaRef,
    /// The join's output.
    pub schema: SchemaRef,
}

/// Counters of the spilled path (EXPLAIN ANALYZE shows them).
#[derive(Clone, Debug)]
pub(super) struct GraceMetrics {
    pub spill: SpillMetrics,
    /// Parts joined in memory.
    pub parts: Count,
    /// Parts split again.
    pub splits: Count,
    /// Chunks of parts that could not be split.
    pub chunks: Count,
}

/// Where the spilled path runs.
#[derive(Clone)]
pub(super) struct Grace {
    pub spec: Arc<JoinSpec>,
    pub context: Arc<TaskContext>,
    pub metrics: GraceMetrics,
    build_files: SpillManager,
    probe_files: SpillManager,
}

/// One side of one part: a spill file (none when it holds no rows).
#[derive(Clone)]
struct Side {
    file: Option<Arc<dyn SpillFile>>,
    rows: usize,
    /// Their size in memory.
    bytes: usize,
}

/// A spill file being written (DataFusion's writer, whose type it does not
/// export): `Some(batch)` appends, `None` finishes.
type Writer = Box<dyn FnMut(Option<&RecordBatch>) -> Result<Option<Arc<dyn SpillFile>>> + Send>;

fn writer(files: &SpillManager) -> Result<Writer> {
    let mut file = files.create_in_progress_file("SpillingHashJoin")?;
    Ok(Box::new(move |batch| match batch {
        Some(batch) => file.append_batch(batch).map(|_| None),
        None => file.finish(),
    }))
}

/// Splits rows among spill files by a hash of their join keys.
struct Splitter {
    keys: Vec<PhysicalExprRef>,
    state: RandomState,
    /// One writer per part: `Some(batch)` appends, `None` finishes.
    files: Vec<Writer>,
    rows: Vec<usize>,
    bytes: Vec<usize>,
    hashes: Vec<u64>,
}

impl Splitter {
    fn new(
        keys: Vec<PhysicalExprRef>,
        fanout: usize,
        level: u32,
        files: &SpillManager,
    ) -> Result<Self> {
        Ok(Self {
            keys,
            // A seed per level: a part's rows share their hash modulo the
            // fanout of the level above, and DataFusion's repartitioning
            // (seed 0) decided which partition of the join they reached.
            state: RandomState::with_seed(0x5eed_0000 + u64::from(level)),
            files: (0..fanout).map(|_| writer(files)).collect::<Result<_>>()?,
            rows: vec![0; fanout],
            bytes: vec![0; fanout],
            hashes: Vec::new(),
        })
    }

    fn push(&mut self, batch: &RecordBatch) -> Result<()> {
        let n = batch.num_rows();
        if n == 0 {
            return Ok(());
        }
        let keys = self
            .keys
            .iter()
            .map(|k| k.evaluate(batch)?.into_array(n))
            .collect::<Result<Vec<ArrayRef>>>()?;
        self.hashes.clear();
        self.hashes.resize(n, 0);
        create_hashes(&keys, &self.state, &mut self.hashes)?;
        let fanout = self.files.len() as u64;
        let mut parts = vec![Vec::<u32>::new(); self.files.len()];
        for (row, hash) in self.hashes.iter().enumerate() {
            // The high bits: the low ones chose the hash join's own buckets.
            parts[((hash >> 32) % fanout) as usize].push(row as u32);
        }
        for (p, rows) in parts.into_iter().enumerate() {
            if rows.is_empty() {
                continue;
            }
            let taken = take_record_batch(batch, &UInt32Array::from(rows))?;
            self.rows[p] += taken.num_rows();
            self.bytes[p] += taken.get_array_memory_size();
            (self.files[p])(Some(&taken))?;
        }
        Ok(())
    }

    fn finish(self) -> Result<Vec<Side>> {
        self.files
            .into_iter()
            .zip(self.rows)
            .zip(self.bytes)
            .map(|((mut file, rows), bytes)| {
                Ok(Side {
                    file: file(None)?,
                    rows,
                    bytes,
                })
            })
            .collect()
    }
}

/// Rows read back from a spill file (or held), as a partition of a plan.
#[derive(Debug)]
struct Source {
    schema: SchemaRef,
    rows: Rows,
}

enum Rows {
    Batches(Vec<RecordBatch>),
    File {
        files: SpillManager,
        file: Option<Arc<dyn SpillFile>>,
        /// Append each row's number in the file (the chunked join).
        numbered: bool,
    },
}

impl std::fmt::Debug for Rows {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Rows::Batches(b) => write!(f, "{} batches", b.len()),
            Rows::File { numbered, .. } => write!(f, "spill file (numbered: {numbered})"),
        }
    }
}

impl PartitionStream for Source {
    fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    fn execute(&self, _ctx: Arc<TaskContext>) -> SendableRecordBatchStream {
        let schema = Arc::clone(&self.schema);
        let stream: BoxStream<'static, Result<RecordBatch>> = match &self.rows {
            Rows::Batches(batches) => {
                futures::stream::iter(batches.clone().into_iter().map(Ok)).boxed()
            }
            Rows::File { file: None, .. } => futures::stream::empty().boxed(),
            Rows::File {
                files,
                file: Some(file),
                numbered,
            } => match files.read_spill_as_stream(Arc::clone(file), None) {
                Err(e) => futures::stream::once(async { Err(e) }).boxed(),
                Ok(stream) if !numbered => stream.boxed(),
                Ok(stream) => {
                    let out = Arc::clone(&schema);
                    let mut next = 0u64;
                    stream
                        .map(move |batch| {
                            let batch = batch?;
                            let n = batch.num_rows() as u64;
                            let ids: ArrayRef =
                                Arc::new(UInt64Array::from_iter_values(next..next + n));
                            next += n;
                            let mut columns = batch.columns().to_vec();
                            columns.push(ids);
                            Ok(RecordBatch::try_new(Arc::clone(&out), columns)?)
                        })
                        .boxed()
                }
            },
        };
        Box::pin(RecordBatchStreamAdapter::new(schema, stream))
    }
}

fn numbered_schema(schema: &SchemaRef) -> SchemaRef {
    let mut fields = schema.fields().to_vec();
    fields.push(Arc::new(Field::new(ROW_ID, DataType::UInt64, false)));
    Arc::new(Schema::new_with_metadata(fields, schema.metadata().clone()))
}

type Batches = BoxStream<'static, Result<RecordBatch>>;

impl Grace {
    pub(super) fn new(
        spec: Arc<JoinSpec>,
        context: Arc<TaskContext>,
        metrics: GraceMetrics,
    ) -> Self {
        let runtime = context.runtime_env();
        let build_files = SpillManager::new(
            Arc::clone(&runtime),
            metrics.spill.clone(),
            Arc::clone(&spec.build_schema),
        );
        let probe_files = SpillManager::new(
            runtime,
            metrics.spill.clone(),
            Arc::clone(&spec.probe_schema),
        );
        Self {
            spec,
            context,
            metrics,
            build_files,
            probe_files,
        }
    }

    /// What one part's build side may take in memory: a quarter of the
    /// query's limit (the rows, the join's copy of them and its table).
    fn part_bytes(&self) -> usize {
        match self.context.memory_pool().memory_limit() {
            MemoryLimit::Finite(n) => (n / 4).max(PART_BYTES_MIN),
            _ => usize::MAX,
        }
    }

    /// Split the build rows (`kept`, then `rest`) and the probe rows into
    /// parts on disk, then join part by part.
    pub(super) async fn run(
        self,
        kept: Vec<RecordBatch>,
        kept_memory: Option<datafusion::execution::memory_pool::MemoryReservation>,
        rest: Option<SendableRecordBatchStream>,
        probes: Vec<SendableRecordBatchStream>,
    ) -> Result<Batches> {
        let build_keys: Vec<_> = self.spec.on.iter().map(|(l, _)| Arc::clone(l)).collect();
        let probe_keys: Vec<_> = self.spec.on.iter().map(|(_, r)| Arc::clone(r)).collect();
        let mut build = Splitter::new(build_keys, FANOUT_FIRST, 0, &self.build_files)?;
        for batch in &kept {
            build.push(batch)?;
        }
        drop(kept);
        drop(kept_memory);
        if let Some(mut rest) = rest {
            while let Some(batch) = rest.next().await {
                build.push(&batch?)?;
            }
        }
        let mut probe = Splitter::new(probe_keys, FANOUT_FIRST, 0, &self.probe_files)?;
        let mut probes = futures::stream::select_all(probes);
        while let Some(batch) = probes.next().await {
            probe.push(&batch?)?;
        }
        let parts: Vec<_> = build.finish()?.into_iter().zip(probe.finish()?).collect();
        Ok(self.join_parts(parts, 1))
    }

    fn join_parts(&self, parts: Vec<(Side, Side)>, level: u32) -> Batches {
        let grace = self.clone();
        futures::stream::iter(parts)
            .then(move |(build, probe)| grace.clone().join_part(build, probe, level))
            .try_flatten()
            .boxed()
    }

    /// Join one part: in memory when its build side fits, else split again,
    /// else in chunks.
    fn join_part(
        self,
        build: Side,
        probe: Side,
        level: u32,
    ) -> BoxFuture<'static, Result<Batches>> {
        async move {
            if build.rows == 0
                && !matches!(
                    self.spec.join_type,
                    JoinType::Right | JoinType::Full | JoinType::RightAnti | JoinType::RightMark
                )
            {
                return Ok(futures::stream::empty().boxed());
            }
            if probe.rows == 0
                && matches!(
                    self.spec.join_type,
                    JoinType::Inner
                        | JoinType::Right
                        | JoinType::RightSemi
                        | JoinType::LeftSemi
                        | JoinType::RightAnti
                        | JoinType::RightMark
                )
            {
                return Ok(futures::stream::empty().boxed());
            }
            if build.bytes <= self.part_bytes() {
                let batches = self.read(&build).await?;
                let mut joined = self.hash_join(
                    batches,
                    self.probe_source(&probe, false),
                    self.spec.join_type,
                    self.spec.projection.clone(),
                )?;
                match joined.next().await {
                    // Its table did not fit after all: split it, or chunk it.
                    Some(Err(e)) if out_of_memory(&e) => {}
                    first => {
                        self.metrics.parts.add(1);
                        return Ok(futures::stream::iter(first).chain(joined).boxed());
                    }
                }
            }
            if level < LEVELS_MAX {
                let parts = self.split(&build, &probe, level).await?;
                if parts.iter().all(|(b, _)| b.rows < build.rows) {
                    self.metrics.splits.add(1);
                    return Ok(self.join_parts(parts, level + 1));
                }
                // One key (or one hash) holds every row: splitting cannot help.
            }
            self.join_in_chunks(build, probe).await
        }
        .boxed()
    }

    async fn split(&self, build: &Side, probe: &Side, level: u32) -> Result<Vec<(Side, Side)>> {
        let build_keys: Vec<_> = self.spec.on.iter().map(|(l, _)| Arc::clone(l)).collect();
        let probe_keys: Vec<_> = self.spec.on.iter().map(|(_, r)| Arc::clone(r)).collect();
        let mut builds = Splitter::new(build_keys, FANOUT_NEXT, level, &self.build_files)?;
        let mut stream = self.stream(&self.build_files, build)?;
        while let Some(batch) = stream.next().await {
            builds.push(&batch?)?;
        }
        let mut probes = Splitter::new(probe_keys, FANOUT_NEXT, level, &self.probe_files)?;
        let mut stream = self.stream(&self.probe_files, probe)?;
        while let Some(batch) = stream.next().await {
            probes.push(&batch?)?;
        }
        Ok(builds.finish()?.into_iter().zip(probes.finish()?).collect())
    }

    fn stream(&self, files: &SpillManager, side: &Side) -> Result<Batches> {
        Ok(match &side.file {
            Some(file) => files.read_spill_as_stream(Arc::clone(file), None)?.boxed(),
            None => futures::stream::empty().boxed(),
        })
    }

    /// A part's build rows in memory.
    async fn read(&self, build: &Side) -> Result<Vec<RecordBatch>> {
        self.stream(&self.build_files, build)?.try_collect().await
    }

    fn probe_source(&self, probe: &Side, numbered: bool) -> Source {
        Source {
            schema: if numbered {
                numbered_schema(&self.spec.probe_schema)
            } else {
                Arc::clone(&self.spec.probe_schema)
            },
            rows: Rows::File {
                files: self.probe_files.clone(),
                file: probe.file.clone(),
                numbered,
            },
        }
    }

    /// DataFusion's hash join of `build` (held) and `probe`.
    fn hash_join(
        &self,
        build: Vec<RecordBatch>,
        probe: Source,
        join_type: JoinType,
        projection: Option<Vec<usize>>,
    ) -> Result<SendableRecordBatchStream> {
        let build_schema = Arc::clone(&self.spec.build_schema);
        let left = Arc::new(StreamingTableExec::try_new(
            Arc::clone(&build_schema),
            vec![Arc::new(Source {
                schema: build_schema,
                rows: Rows::Batches(build),
            })],
            None,
            [],
            false,
            None,
        )?);
        let right = Arc::new(StreamingTableExec::try_new(
            Arc::clone(&probe.schema),
            vec![Arc::new(probe)],
            None,
            [],
            false,
            None,
        )?);
        let join = HashJoinExecBuilder::new(left, right, self.spec.on.clone(), join_type)
            .with_filter(self.spec.filter.clone())
            .with_projection(projection)
            .with_partition_mode(PartitionMode::CollectLeft)
            .with_null_equality(self.spec.null_equality)
            .build_exec()?;
        join.execute(0, Arc::clone(&self.context))
    }

    /// Join a part whose build side cannot be split, a chunk of its build
    /// rows at a time against all its probe rows. Each build row is in one
    /// chunk, so what the join says of build rows (matched or not) is whole
    /// per chunk; what it says of probe rows is gathered over the chunks by
    /// their numbers and said at the end.
    async fn join_in_chunks(&self, build: Side, probe: Side) -> Result<Batches> {
        let spec = Arc::clone(&self.spec);
        let left_len = spec.build_schema.fields().len();
        let right_len = spec.probe_schema.fields().len();
        // The join each chunk runs, and where the probe row's number is in
        // its output (None: the chunks' rows are the output as they are).
        let (chunk_type, id_at) = match spec.join_type {
            JoinType::Inner
            | JoinType::Left
            | JoinType::LeftSemi
            | JoinType::LeftAnti
            | JoinType::LeftMark => (spec.join_type, None),
            JoinType::Right => (JoinType::Inner, Some(left_len + right_len)),
            JoinType::Full => (JoinType::Left, Some(left_len + right_len)),
            JoinType::RightSemi | JoinType::RightAnti | JoinType::RightMark => {
                (JoinType::RightSemi, Some(right_len))
            }
        };
        let projection = match (id_at, &spec.projection) {
            (None, projection) => projection.clone(),
            (Some(_), _) if chunk_type == JoinType::RightSemi => None,
            (Some(id), Some(p)) => Some(p.iter().copied().chain([id]).collect()),
            (Some(id), None) => Some((0..=id).collect()),
        };
        let emit_chunk_rows = chunk_type != JoinType::RightSemi;
        let mut matched = BooleanBufferBuilder::new(probe.rows);
        matched.append_n(probe.rows, false);
        let matched = Arc::new(std::sync::Mutex::new(matched));
        let chunk_bytes = (self.part_bytes() / 2).max(PART_BYTES_MIN);
        let reader = self.stream(&self.build_files, &build)?;
        let grace = self.clone();
        // One item per chunk (its joined rows), then the probe rows' end;
        // a chunk is read when the rows of the one before are all out.
        let chunks = futures::stream::try_unfold((reader, false), move |(mut reader, ended)| {
            let grace = grace.clone();
            let probe = probe.clone();
            let projection = projection.clone();
            let matched = Arc::clone(&matched);
            async move {
                if ended {
                    return Ok::<_, datafusion::error::DataFusionError>(None);
                }
                let mut chunk = Vec::new();
                let mut size = 0;
                while size < chunk_bytes {
                    match reader.next().await {
                        Some(batch) => {
                            let batch = batch?;
                            size += batch.get_array_memory_size();
                            chunk.push(batch);
                        }
                        None => break,
                    }
                }
                if chunk.is_empty() {
                    if id_at.is_none() {
                        return Ok(None);
                    }
                    let mut seen = std::mem::replace(
                        &mut *matched.lock().unwrap_or_else(|e| e.into_inner()),
                        BooleanBufferBuilder::new(0),
                    );
                    let end =
                        grace.probe_rows_by_match(&probe, BooleanArray::from(seen.finish()))?;
                    return Ok(Some((end, (reader, true))));
                }
                grace.metrics.chunks.add(1);
                let joined = grace.hash_join(
                    chunk,
                    grace.probe_source(&probe, id_at.is_some()),
                    chunk_type,
                    projection,
                )?;
                let rows: Batches = match id_at {
                    None => joined.boxed(),
                    Some(_) => joined
                        .map(move |batch| {
                            let batch = batch?;
                            let last = batch.num_columns() - 1;
                            if let Some(ids) =
                                batch.column(last).as_any().downcast_ref::<UInt64Array>()
                            {
                                let mut seen = matched.lock().unwrap_or_else(|e| e.into_inner());
                                for id in ids.iter().flatten() {
                                    seen.set_bit(id as usize, true);
                                }
                            }
                            let kept: Vec<usize> = (0..last).collect();
                            batch.project(&kept).map_err(Into::into)
                        })
                        .try_filter(move |b| {
                            futures::future::ready(emit_chunk_rows && b.num_rows() > 0)
                        })
                        .boxed(),
                };
                Ok(Some((rows, (reader, false))))
            }
        });
        Ok(chunks.try_flatten().boxed())
    }

    /// The end of a chunked join whose output says something of each probe
    /// row: its rows by whether a chunk matched them.
    fn probe_rows_by_match(&self, probe: &Side, matched: BooleanArray) -> Result<Batches> {
        let spec = Arc::clone(&self.spec);
        let (full_schema, _) =
            build_join_schema(&spec.build_schema, &spec.probe_schema, &spec.join_type);
        let full_schema = Arc::new(full_schema);
        let mut offset = 0;
        let stream = self.stream(&self.probe_files, probe)?.map(move |batch| {
            let batch = batch?;
            let n = batch.num_rows();
            let seen = matched.slice(offset, n);
            offset += n;
            let seen = seen
                .as_any()
                .downcast_ref::<BooleanArray>()
                .expect("booleans")
                .clone();
            let unseen = arrow::compute::not(&seen)?;
            let full = match spec.join_type {
                JoinType::Right | JoinType::Full => {
                    let rows = filter_record_batch(&batch, &unseen)?;
                    let mut columns: Vec<ArrayRef> = spec
                        .build_schema
                        .fields()
                        .iter()
                        .map(|f| new_null_array(f.data_type(), rows.num_rows()))
                        .collect();
                    columns.extend(rows.columns().iter().cloned());
                    RecordBatch::try_new(Arc::clone(&full_schema), columns)?
                }
                JoinType::RightSemi => filter_record_batch(&batch, &seen)?,
                JoinType::RightAnti => filter_record_batch(&batch, &unseen)?,
                _ => {
                    // RightMark: every probe row, and whether it matched.
                    let mut columns = batch.columns().to_vec();
                    columns.push(Arc::new(seen));
                    RecordBatch::try_new(Arc::clone(&full_schema), columns)?
                }
            };
            let projected = match &spec.projection {
                Some(p) => full.project(p)?,
                None => full,
            };
            Ok(RecordBatch::try_new(
                Arc::clone(&spec.schema),
                projected.columns().to_vec(),
            )?)
        });
        Ok(stream.boxed())
    }
}
