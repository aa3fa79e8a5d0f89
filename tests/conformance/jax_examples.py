"""The example specs (examples/criteo, examples/movielens) run with a jax shards layout, and their steps as the
shard job maps them: the input of the JAX conformance tests (tests/conformance/test_jax_*)."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional

ROOT = Path(__file__).resolve().parents[2]


# Wide enough that movie_id's and User_id's activations are 1 MiB each per SparseCore (2 samples per SparseCore,
# x 131072 x 4 bytes): TensorFlow keeps each table alone (a stack stays strictly under 2 MiB), jax stacks them
# (its limit is inclusive).
WIDE_DIM = 131072


def differing_stacks(text: str, topology: Optional[str] = None, tf_alone: bool = False) -> str:
    """examples/movielens/spec.yaml edited so that TensorFlow's stacks are not jax's: occupation (sum) and title
    (sqrtn) join age and genres (mean) in TF's width-8 Adagrad stack, while jax groups by combiner too (age and
    genres; occupation and title each alone); user_id looks up a table `User_id`, which TF's name order puts
    before movie_id and jax's (first appearance among the features, by feature name) after it; zip (SGD) alone in
    both. `topology`: another `topology:` line's value. `tf_alone`: movie_id and User_id `WIDE_DIM` wide, which
    TF keeps each alone and jax stacks together (16 examples a step on 8 SparseCores)."""
    dim = WIDE_DIM if tf_alone else 16
    edits = [("{name: user_id, vocabulary: {type: identity, num_buckets: 6041}}",
              "{name: user_id, vocabulary: {type: identity, num_buckets: 6041}, table: User_id}"),
             ("{name: user_id, dim: 16}", f"{{name: User_id, dim: {dim}}}"),
             ("{name: movie_id, dim: 16}", f"{{name: movie_id, dim: {dim}}}"),
             ("{name: occupation, dim: 8}", "{name: occupation, dim: 8, combiner: sum}"),
             ("{name: title, dim: 8}", "{name: title, dim: 8, combiner: sqrtn}")]
    if topology is not None:
        edits.append(("topology: {num_chips: 2, num_sc_per_chip: 4, num_hosts: 2}", f"topology: {topology}"))
    for a, b in edits:
        assert text.count(a) == 1, a
        text = text.replace(a, b)
    return text


def example_artifact(tmp_path, name: str, layout: str = "both", shards: str = "",
                     edit: Optional[Callable[[str], str]] = None):
    """The example spec `name` with `shards: {layout: <layout>, <shards>}` (and its text changed by `edit`), run
    (`tpu-embed run`): (spec, artifact dir, sizes, the steps' ExampleBlocks mapped as the shard job maps them)."""
    from pipelines.cli import main as cli_main
    from tpu_embed.artifact.spec import load_spec

    text = (ROOT / "examples" / name / "spec.yaml").read_text().replace("../../data/", f"{ROOT}/data/")
    if edit is not None:
        text = edit(text)
    tag = f"{name}-{layout}" + ("-" + shards.replace(":", "").replace(" ", "") if shards else "")
    path = tmp_path / f"{tag}.yaml"
    path.write_text(text + f"\nshards: {{layout: {layout}{', ' + shards if shards else ''}}}\n")
    out = str(tmp_path / tag)
    cli_main(["run", "--spec", str(path), "--output", out])
    spec = load_spec(str(path))
    return (spec, out, *mapped_steps(spec, out))


def mapped_steps(spec, out: str):
    """(vocabulary sizes, the steps' ExampleBlocks) of the artifact `out` made from `spec`: its input read and
    mapped with the artifact's vocabularies as the shard job maps it (a lineage day's too), batched into steps."""
    import collections

    from pipelines import jobs, runner
    from pipelines.jobs import map_to_ids
    from pipelines.mapping import ids as mapping
    from pipelines.read import parse, records, splits
    from pipelines.sharding.batches import ExampleBlock

    cfg = jobs.JobConfig(spec=spec, output=out)
    sizes = runner.vocab_sizes_for(cfg)
    vocabs = map_to_ids.load_vocabularies(spec, out)
    blocks = []
    for f in splits.list_input_files(spec.input_patterns()):
        for raw in splits.read_file("csv", f, spec.required_columns()):
            if isinstance(raw, records.RawBatch):
                chunk, _ = parse.parse_batch(raw, spec)
                blocks.append(mapping.map_chunk(chunk, spec, vocabs, collections.Counter()))
    block = ExampleBlock.concat(blocks)
    B = spec.global_batch_size
    steps = [block.slice(s * B, (s + 1) * B) for s in range(block.num_examples // B)]
    if spec.policies.tail == "pad" and block.num_examples % B:
        rest = block.slice(len(steps) * B, block.num_examples)
        steps.append(ExampleBlock.concat([rest, ExampleBlock.padding(B - rest.num_examples, len(spec.dense), rest)]))
    return sizes, steps


def oracle_request(spec, sizes, steps, lead: bool) -> dict:
    """The request of jax_layout_server.py for the steps `steps` (ExampleBlocks) of `spec`: its model's tables
    (each table's jax optimizer kind and learning rate) and features, the topology, each step's host features."""
    from pipelines.sharding import step_records
    from tpu_embed.sparsecore import jax_layout as J

    model = spec.model(sizes)
    jl = J.jax_layout(model)
    opt = {}
    for t in model.tables:
        d = t.optimizer.to_dict()
        opt[t.name] = (d["optimizer"], float(d["learning_rate"]))
    groups: dict = {}
    for t in model.tables:  # the (kind, learning rate) the oracle gets must group the tables as ours do
        assert groups.setdefault(opt[t.name], t.optimizer_group) == t.optimizer_group
    chips, hosts = spec.topology.num_chips, spec.topology.num_hosts
    return {"tables": [{"name": t.name, "vocabulary_size": t.vocabulary_size, "dim": t.dim, "combiner": t.combiner,
                        "optimizer": opt[t.name]} for t in model.tables],
            "features": [{"name": f.name, "table": f.table.name, "samples": f.samples * chips}
                         for f in model.features],
            "num_devices": chips, "num_sc_per_device": spec.topology.num_sc_per_chip, "num_hosts": hosts,
            "dense": [], "has_leading_dimension": lead,
            "steps": [[{n: (hf.row_splits, hf.ids, hf.weights)
                        for n, hf in step_records.jax_host_features(b, spec, jl, h).items()} for h in range(hosts)]
                      for b in steps]}


def fdo_artifacts(tmp_path_factory, examples: dict):
    """get(name) -> (spec, artifact, steps, jax-fdo directory) for `examples` ({name: (example, layout, edit)}):
    the example run, and the exact limits of its jax stacking written by
    `tpu-embed plan --artifact ARTIFACT --format jax-fdo`; made once each."""
    from pipelines import cli

    cache: dict = {}

    def get(name):
        if name not in cache:
            tmp = tmp_path_factory.mktemp(name)
            example, layout, edit = examples[name]
            spec, out, _, steps = example_artifact(tmp, example, layout, edit=edit)
            fdo = str(tmp / "fdo")
            assert cli.main(["plan", "--artifact", out, "--format", "jax-fdo", "--output", fdo]) == 0
            cache[name] = (spec, out, steps, fdo)
        return cache[name]
    return get


def host_features(spec, out: str, steps, h: int) -> list:
    """Each step's features of host `h` as the shard job hands them to the jax layout: {name: (row_splits, ids,
    weights)}."""
    from pipelines.sharding import step_records
    from tpu_embed.artifact.load import load_artifact
    from tpu_embed.sparsecore import jax_layout as J

    jl = J.jax_layout(load_artifact(out).model)
    return [{n: (hf.row_splits, hf.ids, hf.weights) for n, hf in step_records.jax_host_features(b, spec, jl, h).items()}
            for b in steps]
