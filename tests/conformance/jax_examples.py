"""The example specs (examples/criteo, examples/movielens) run with a jax shards layout, and their steps as the
shard job maps them: the input of the JAX conformance tests (tests/conformance/test_jax_*)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def example_artifact(tmp_path, name: str, layout: str = "both", shards: str = ""):
    """The example spec `name` with `shards: {layout: <layout>, <shards>}`, run (`tpu-embed run`): (spec,
    artifact dir, sizes, the steps' ExampleBlocks mapped as the shard job maps them)."""
    import collections

    from pipelines import jobs, runner
    from pipelines.cli import main as cli_main
    from pipelines.jobs import map_to_ids
    from pipelines.mapping import ids as mapping
    from pipelines.read import parse, records, splits
    from pipelines.sharding.batches import ExampleBlock
    from tpu_embed.artifact.spec import load_spec

    text = (ROOT / "examples" / name / "spec.yaml").read_text().replace("../../data/", f"{ROOT}/data/")
    tag = f"{name}-{layout}" + ("-" + shards.replace(":", "").replace(" ", "") if shards else "")
    path = tmp_path / f"{tag}.yaml"
    path.write_text(text + f"\nshards: {{layout: {layout}{', ' + shards if shards else ''}}}\n")
    out = str(tmp_path / tag)
    cli_main(["run", "--spec", str(path), "--output", out])
    spec = load_spec(str(path))
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
    return spec, out, sizes, steps


def oracle_request(spec, sizes, steps, lead: bool) -> dict:
    """The request of jax_layout_server.py for the steps `steps` (ExampleBlocks) of `spec`: its model's tables
    (each table's jax optimizer kind and learning rate) and features, the topology, each step's host features."""
    from pipelines.sharding import step_records
    from tpu_embed.jax import layout as J

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
