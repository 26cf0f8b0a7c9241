"""The bench's phases that judge the planner (`bench.run.Bench`): boundary and long slices,
families, parts, recompute and held-out points, each run through the pod's command and written
as a record beside the plan it was given. A mixin: the child runner, the record writer, the
budget and the arguments are `Bench`'s.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.report import gpu_slug


class PlanPhases:
    """The planner's judges among the bench's phases (their state lives on `Bench`)."""

    # Bench's, used here.
    args: Any
    date: str
    left_s: Callable[[], float]
    ours: Callable[..., dict[str, Any] | None]
    write: Callable[[str, dict[str, Any]], Path]
    build_once: Callable[[str, Path, list[str]], None]

    def boundary(self, peaks: list[dict[str, Any]], versions: dict[str, Any]) -> None:
        """Shapes planned to fit with at most a layer to spare under 22.4 GiB, each run for
        `--steps` steps (at least 8) with a checkpoint and an evaluation inside."""
        from bench import boundary

        steps = max(8, self.args.steps)
        wanted = {n for n in self.args.boundary_points.split(",") if n}
        points = [p for p in (*boundary.POINTS, *boundary.AUTO_POINTS) if not wanted or p.name in wanted]
        chosen = [(point, boundary.deepest(point, steps)) for point in points]
        self.slices(chosen, steps, f"{self.date}-{gpu_slug(peaks)}-boundary.json", peaks, versions)

    def long(self, peaks: list[dict[str, Any]], versions: dict[str, Any]) -> None:
        """`boundary.LONG_POINTS` at their set depths, capped at 22.4 GiB, for `--steps` steps with a
        checkpoint and an evaluation inside: the boundary record's rows, in a record of their own."""
        from bench import boundary

        wanted = {n for n in self.args.boundary_points.split(",") if n}  # names with depth: 70b-s8192-b1-ckpt-12l
        points = [p for p in boundary.LONG_POINTS if not wanted or f"{p.name}-{p.layers}l" in wanted]
        chosen = [(p, p.layers if boundary.planned(p, p.layers or 0, self.args.steps).fits else 0) for p in points]
        self.slices(chosen, self.args.steps, f"{self.date}-{gpu_slug(peaks)}-boundary-long.json", peaks, versions)

    def slices(
        self,
        chosen: list[tuple[Any, int]],
        steps: int,
        name: str,
        peaks: list[dict[str, Any]],
        versions: dict[str, Any],
    ) -> None:
        """Each (point, layers) through the pod's command on a slice of one model per width, written
        once as deep as the deepest slice; plan against measured peak, row by row into `name`."""
        from bench import boundary, recompute

        print(f"[bench] slices: {[(p.name, n) for p, n in chosen]}", flush=True)
        rows: list[dict[str, Any]] = []
        record = {"date": self.date, "gpu": peaks[0].get("gpu"), "capGiB": boundary.CAP_GIB, "steps": steps}
        record["versions"] = versions
        for width in boundary.WIDTHS:
            depth = max((n for p, n in chosen if p.width == width), default=0)
            if depth == 0:
                continue
            model = self.args.work / f"boundary-{width}-{depth}l"
            if not (model / "config.json").exists():
                # Random-init bf16 weights written on the GPU (the reference builder writes on the CPU).
                shape = recompute.Shape(f"boundary-{width}", width, depth, None)
                self.child(f"build-{width}-{depth}l", recompute.build_argv(sys.executable, model, shape), 1)
            for point, layers in chosen:
                if point.width != width or layers == 0:
                    continue
                plan = boundary.planned(point, layers, steps)
                ours = None
                if self.left_s() > 150:
                    folder = boundary.slice_folder(model, self.args.work / f"slice-{point.name}-{layers}l", layers)
                    ours = self.ours(
                        1,
                        f"boundary-{point.name}-{layers}l",
                        model=folder,
                        seq=point.seq,
                        ckpt=point.ckpt,
                        batch=point.batch,
                        steps=steps,
                        every=max(1, steps // 2),
                        eval_fraction=0.1,
                        gpu_memory_gib=boundary.CAP_GIB,
                    )
                rows.append(boundary.judge(point, layers, plan, ours))
                record["points"] = rows
                self.write(name, record)
            # The next width's model needs the disk (70B-shaped, 19 layers: 37 GB of bf16).
            shutil.rmtree(model, ignore_errors=True)

    def families(self, peaks: list[dict[str, Any]], versions: dict[str, Any]) -> None:
        """A Gemma-2-shaped and a Qwen2.5-shaped slice, capped at 22.4 GiB, through the pod's
        command for `--steps` steps (at least 8), a checkpoint and an evaluation inside."""
        from bench import families

        steps = max(8, self.args.steps)
        record: dict[str, Any] = {"date": self.date, "gpu": peaks[0].get("gpu"), "capGiB": families.CAP_GIB}
        record.update(steps=steps, versions=versions, families=[])
        for family in families.SHAPES:
            layers = families.LAYERS if families.planned(family, families.LAYERS, steps).plan.fits else 0
            launch = families.planned(family, layers, steps)
            ours = None
            if layers and self.left_s() > 150:
                model = self.args.work / f"family-{family}-{layers}l"
                if not (model / "config.json").exists():
                    self.child(f"build-{family}", families.build_argv(sys.executable, model, family, layers), 1)
                ours = self.ours(
                    1,
                    f"family-{family}",
                    model=model,
                    seq=families.SEQ,
                    steps=steps,
                    every=steps // 2,
                    eval_fraction=0.1,
                    gpu_memory_gib=families.CAP_GIB,
                    tokenizer="bytes",
                )
            record["families"].append(families.judge(family, layers, launch, ours))
            self.write(f"{self.date}-{gpu_slug(peaks)}-families.json", record)

    def parts(self, peaks: list[dict[str, Any]], versions: dict[str, Any]) -> None:
        """Each point of bench.parts through the pod's command: the plan's parts against the
        trainer's phase probe."""
        from bench import boundary, parts, recompute

        record: dict[str, Any] = {"date": self.date, "gpu": peaks[0].get("gpu"), "steps": parts.STEPS}
        record.update(versions=versions, points=[])
        wanted = {n for n in self.args.parts_points.split(",") if n}
        chosen = [p for p in parts.POINTS if not wanted or p.name in wanted]
        models = {}
        for width in boundary.WIDTHS:
            layers = max((p.layers for p in chosen if p.width == width), default=0)
            if not layers:
                continue
            models[width] = self.args.work / f"parts-{width}-{layers}l"
            if not (models[width] / "config.json").exists():
                shape = recompute.Shape(f"parts-{width}", width, layers, None)
                self.child(f"build-parts-{width}", recompute.build_argv(sys.executable, models[width], shape), 1)
        for point in chosen:
            ours = None
            if self.left_s() > 90:
                slice_dir = self.args.work / f"slice-{point.name}"
                folder = boundary.slice_folder(models[point.width], slice_dir, point.layers)
                ours = self.ours(1, f"parts-{point.name}", model=folder, **parts.ours_extra(point))
            record["points"].append(parts.row(point, ours))
            self.write(f"{self.date}-{gpu_slug(peaks)}-parts.json", record)

    def recompute(self, peaks: list[dict[str, Any]], versions: dict[str, Any]) -> None:
        """Each shape of bench.recompute through the pod's command, all-recompute then auto."""
        from bench import recompute

        steps = self.args.steps + self.args.warm
        record: dict[str, Any] = {"date": self.date, "gpu": peaks[0].get("gpu"), "steps": steps, "seq": recompute.SEQ}
        record.update(versions=versions, shapes=[])
        wanted = {n for n in self.args.recompute_shapes.split(",") if n}
        for shape in (s for s in recompute.SHAPES if not wanted or s.name in wanted):
            if self.left_s() < 60:
                print(f"[bench] budget spent; recompute {shape.name} not run", flush=True)
                continue
            model = self.args.work / f"recompute-{shape.name}"
            self.build_once(f"build-{shape.name}", model, recompute.build_argv(sys.executable, model, shape))
            rows = []
            for label, ckpt, offload in recompute.runs(shape, self.args.recompute_keep_only):
                launch = recompute.planned(shape, ckpt, steps, peaks[0].get("memory_gib"), offload)
                ours = None
                if self.left_s() > 45:
                    extra = recompute.ours_extra(shape, ckpt, steps, offload)
                    ours = self.ours(1, f"recompute-{shape.name}-{label}", model=model, **extra)
                rows.append(recompute.run_row(label, launch, ours))
                done = [s for s in record["shapes"] if s["shape"] != shape.name]
                record["shapes"] = [*done, recompute.judge(shape, rows)]
                self.write(f"{self.date}-{gpu_slug(peaks)}-recompute.json", record)
            print(f"[bench] recompute {shape.name}: ratio {record['shapes'][-1]['ratio']}", flush=True)

    def heldout(self, peaks: list[dict[str, Any]], versions: dict[str, Any]) -> None:
        """Each point of bench.heldout through the pod's command: auto, then each alternative whose
        plan lays the layers out differently from every run before it."""
        from bench import heldout

        steps = self.args.steps + self.args.warm
        record: dict[str, Any] = {"date": self.date, "gpu": peaks[0].get("gpu"), "steps": steps}
        record.update(warm=self.args.warm, versions=versions, points=[])
        wanted = {n for n in self.args.heldout_points.split(",") if n}
        for point in (p for p in heldout.POINTS if not wanted or p.name in wanted or p.kind in wanted):
            if self.left_s() < 60:
                print(f"[bench] budget spent; heldout {point.name} not run", flush=True)
                continue
            model = self.args.work / f"heldout-{point.name}"
            self.build_once(f"build-{point.name}", model, heldout.build_argv(sys.executable, model, point))
            rows: list[dict[str, Any]] = []
            seen: dict[tuple[Any, ...], dict[str, Any]] = {}
            for label, ckpt, offload in heldout.RUNS:
                launch = heldout.planned(point, ckpt, offload, steps, record["gpu"] or "NVIDIA H200")
                row = heldout.plan_row(label, launch)
                layout = heldout.layout_of(launch)
                if layout in seen:
                    same = seen[layout]  # the plan's figures are that run's too: the same layout
                    rows.append({**same, "run": label, "sameAs": same["run"]})
                elif self.left_s() > 45:
                    extra = heldout.ours_extra(point, ckpt, offload, steps)
                    ours = self.ours(1, f"heldout-{point.name}-{label}", model=model, **extra)
                    rows.append(heldout.measured_row(row, ours))
                    seen[layout] = rows[-1]
                else:
                    rows.append(heldout.measured_row(row, None))
                done = [p for p in record["points"] if p["point"] != point.name]
                record["points"] = [*done, heldout.judge(point, rows)]
                self.write(f"{self.date}-{gpu_slug(peaks)}-heldout.json", record)
            print(f"[bench] heldout {point.name}: {record['points'][-1]['holds']}", flush=True)
