"""Hardware files: one GPU type, how GPUs connect inside a node and across nodes.

A hardware file is either a *template* (a GPU spec, ``nodes`` x ``gpus_per_node``,
an intra-node fabric and an inter-node fabric) or an *explicit* list of devices,
switches and links for any topology. Either way it becomes a
:class:`~simtrain.spec.topology.Cluster`, whose network is a networkx graph.
Every number in a bundled file carries a ``source:``.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, PositiveInt, model_validator

from simtrain.spec.attention_kernels import ATTENTION_FORWARD_RATIO, SPEED_ENTRY, forward_rate_factor
from simtrain.spec.errors import InputError, allowed, display_path, suggest
from simtrain.spec.explicit_topology import all_joined, not_an_internal_name
from simtrain.spec.hardware_curves import Count, Curve, WidthCurve, interpolate_linear
from simtrain.spec.quantity import (
    Bandwidth,
    Bytes,
    BytesOrZero,
    Flops,
    Fraction,
    Number,
    PositiveNumber,
    Seconds,
    Watts,
)
from simtrain.spec.schema import Closed, FieldError, validate
from simtrain.spec.yamlio import load_yaml, looks_like_path, reference_path

#: the repository's hardware/ folder (a checkout or an editable install) ...
_PACKAGE = Path(__file__).resolve().parents[1]   # simtrain/
_REPO_HARDWARE = _PACKAGE.parent / "hardware"


def bundled_hardware_dir() -> Path:
    """Where the bundled hardware files live: the checkout, else the installed package."""
    if _REPO_HARDWARE.is_dir():
        return _REPO_HARDWARE
    # an installed wheel carries hardware/ as simtrain/hardware_data (pyproject package-dir)
    return _PACKAGE / "hardware_data"


def bundled_hardware_names() -> list[str]:
    return list(_bundled_names(bundled_hardware_dir()))


@lru_cache(maxsize=4)
def _bundled_names(folder: Path) -> tuple[str, ...]:
    return tuple(sorted(p.stem for p in folder.glob("*.yaml")))


class GpuSpec(Closed):
    """One accelerator: capacity, HBM bandwidth and dense peak rates per dtype."""

    name: str
    memory: Bytes = Field(description="usable HBM capacity, bytes")
    memory_bandwidth: Bandwidth = Field(description="HBM bandwidth, bytes/s")
    peak_flops: dict[Literal["bf16", "fp16", "fp32", "tf32", "fp8", "mxfp8"], Flops] = Field(
        description="dense tensor-core peak per dtype, FLOP/s; fp8 = FP8 (E4M3/E5M2) GEMMs with per-tensor or "
                    "software block scales, mxfp8 = OCP microscaling FP8 with hardware block scales (Blackwell); "
                    "absent = the GPU has none")
    power: Watts | None = Field(None, description="board power (TDP), W")

    @model_validator(mode="after")
    def _needs_half(self) -> GpuSpec:
        if "bf16" not in self.peak_flops and "fp16" not in self.peak_flops:
            raise FieldError("needs at least bf16 or fp16 (the training precisions)", "peak_flops")
        return self

    def peak(self, dtype: str) -> float:
        """Peak FLOP/s for a training precision; fp32 training runs its GEMMs in tf32 where available."""
        if dtype == "fp32":
            return self.peak_flops.get("tf32", self.peak_flops.get("fp32", 0.0)) or min(self.peak_flops.values())
        other = "fp16" if dtype == "bf16" else "bf16"
        return self.peak_flops.get(dtype, self.peak_flops.get(other))

    def gemm_peak(self, precision: str, fp8_recipe: str = "tensorwise") -> float:
        """Peak FLOP/s of the GEMMs that run in the training precision; fp8 training runs its linear layers'
        GEMMs on the FP8 peak (mxfp8 on the MXFP8 one). 0 when the GPU has none (the scenario rules refuse it)."""
        if precision != "fp8":
            return self.peak(precision)
        return self.peak_flops.get("mxfp8" if fp8_recipe == "mxfp8" else "fp8", 0.0)

    @property
    def dense_half_peak(self) -> float:
        """The dense BF16 (else FP16) peak: MFU's denominator whatever the training precision."""
        return self.peak("bf16")


class IntraNode(Closed):
    """GPU-to-GPU fabric inside a node, or across the nodes of a scale-up domain.

    ``nvswitch`` and ``pcie`` connect every GPU of a node to one hub at ``bandwidth``; ``mesh`` connects every pair
    of GPUs of a node by its own point-to-point link of ``bandwidth`` (AMD Infinity Fabric: a ring uses one link per
    hop, an all-to-all all of them at once). ``domain_gpus`` larger than the node makes one NVSwitch fabric span
    several nodes (GB200/GB300 NVL72: 18 trays of 4 GPUs on one 72-GPU NVLink domain); the scale-out network
    starts above the domain."""

    fabric: Literal["nvswitch", "pcie", "mesh"] = "nvswitch"
    domain_gpus: Count | None = Field(
        None, description="GPUs on this fabric (the scale-up domain): a whole number of nodes; absent = one node. "
                          "Groups inside a domain talk over this fabric even when they span nodes (trays)")
    bandwidth: Bandwidth = Field(description="per GPU, per direction (mesh: per point-to-point link)")
    latency: Seconds = Field(description="per message, GPU to GPU")
    efficiency: Fraction = Field(1.0, description="fraction of link rate NCCL reaches for large messages")
    half_peak_message: BytesOrZero = Field(
        0.0, description="collective size at which bus bandwidth is half its peak (NCCL's message-size ramp); "
                         "a collective of S bytes then takes as long as one of S + this at full bandwidth")
    busbw_curve: Curve | None = Field(
        None, description="measured all-reduce bus bandwidth over one whole node, as [bytes per GPU, fraction of the "
                          "large-message figure] points (nccl-tests); give it instead of half_peak_message")
    curve_gpus: Count | None = Field(
        None, description="GPUs the busbw_curve was measured over, where fewer than the domain (default: the domain)")
    overlap_slowdown: PositiveNumber | None = Field(
        None, description="compute slows by this factor while a collective on this fabric runs; "
                          "default compute.overlap_slowdown")

    @model_validator(mode="after")
    def _one_ramp(self) -> IntraNode:
        if self.busbw_curve is not None and self.half_peak_message > 0:
            raise FieldError("give either busbw_curve or half_peak_message, not both (the curve replaces it)",
                             "half_peak_message")
        return self


class InterNode(Closed):
    """The scale-out network between nodes."""

    topology: Literal["single-switch", "fat-tree", "rail-optimized"] = "rail-optimized"
    nics_per_node: PositiveInt = 8
    nic_bandwidth: Bandwidth = Field(description="per NIC, per direction")
    latency: Seconds = Field(description="NIC to NIC, per message")
    efficiency: Fraction = 1.0
    oversubscription: PositiveNumber = Field(1.0, description="fat-tree leaf downlink:uplink ratio; 1 = non-blocking")
    nodes_per_leaf: PositiveInt = Field(4, description="fat-tree: nodes under one leaf switch")
    pcie_bandwidth: Bandwidth | None = Field(None, description="GPU <-> NIC link per direction; default unlimited")
    half_peak_message: BytesOrZero = Field(
        0.0, description="collective size at which bus bandwidth across nodes is half its peak; 0 = none")
    overlap_slowdown: PositiveNumber | None = Field(
        None, description="compute slows by this factor while a collective crossing the network runs; "
                          "default compute.overlap_slowdown")


class ComputeModel(Closed):
    """How close kernels come to the datasheet peaks (issue: fidelity)."""

    gemm_efficiency: Fraction = Field(1.0, description="best fraction of dense peak a large GEMM reaches")
    gemm_half_size: Number = Field(0.0, description="GEMM size (geo-mean of M,N,K) at which efficiency halves; "
                                                    "0 = flat")
    gemm_curve: Curve | None = Field(None, description="measured [size, fraction of peak] points (size = geo-mean of "
                                                       "M,N,K); when given it replaces gemm_efficiency/gemm_half_size")
    fp8_gemm_curve: Curve | None = Field(
        None, description="measured FP8 GEMM [size, fraction of the FP8 peak] points, for the GEMMs of fp8 training "
                          "(MXFP8 too); absent = the BF16 curve's fractions (a warning says so)")
    attention_efficiency: Fraction = Field(1.0, description="flash attention fwd+bwd fraction of peak, long sequences")
    attention_half_seq: Number = Field(0.0, description="sequence length at which flash attention reaches half its "
                                                        "best efficiency; 0 = flat")
    attention_kernels: dict[Literal["flash1", "flash3", "cudnn"], PositiveNumber] = Field(
        default_factory=dict, description="other flash-attention kernels this GPU runs, as their speed relative "
                                          "to the FlashAttention-2 figures above (absent = not available)")
    attention_head_width: dict[Literal["flash1", "flash2", "flash3", "cudnn"], WidthCurve] = Field(
        default_factory=dict, description="a flash-attention kernel's measured speed at a head width relative to its "
                                          "speed at the width the figures above were taken at: [[head width, "
                                          "relative speed], ...], linear in the width between points, flat beyond "
                                          "the ends (absent = the same speed at every width)")
    sustained_fraction: Fraction = Field(
        1.0, description="fraction of a short benchmark's matmul rate the GPU holds under a sustained training load, "
                         "once its power limit has settled the clock below boost (the maximum sustainable over the "
                         "maximum achievable matmul rate); scales the GEMM efficiency, whose figures come from short "
                         "benchmarks")
    memory_efficiency: Fraction = Field(1.0, description="fraction of HBM bandwidth streaming kernels reach")
    norm_forward_efficiency: Fraction | None = Field(
        None, description="fraction of HBM bandwidth the framework's layer-norm forward kernel reaches "
                          "(absent = memory_efficiency)")
    norm_backward_efficiency: Fraction | None = Field(
        None, description="fraction of HBM bandwidth the layer-norm backward (input and weight gradients) reaches "
                          "(absent = memory_efficiency)")
    unfused_attention_forward_efficiency: Fraction | None = Field(
        None, description="fraction of HBM bandwidth attention without a fused (flash) kernel reaches in its forward "
                          "score GEMMs and softmax, over the bytes simtrain counts for them (absent = "
                          "memory_efficiency)")
    unfused_attention_backward_efficiency: Fraction | None = Field(
        None, description="the same for the backward's four score GEMMs and the softmax backward (absent = "
                          "memory_efficiency)")
    kernel_overhead: Seconds = Field(0.0, description="per-kernel launch/gap")
    overlap_slowdown: PositiveNumber = Field(1.0, description="compute slows by this factor while a collective runs")

    @model_validator(mode="after")
    def _attention_below_peak(self) -> ComputeModel:
        derived = [k for k, entry in SPEED_ENTRY.items() if entry in self.attention_kernels]
        for kernel in ("flash2", *self.attention_kernels, *derived):
            curve = self.attention_head_width.get(kernel, ((1.0, 1.0),))
            # a kernel whose forward outruns its backward runs that forward above its forward + backward rate
            fastest = self.attention_efficiency * self.attention_speed(kernel) * max(y for _, y in curve) * \
                forward_rate_factor(ATTENTION_FORWARD_RATIO.get(kernel, 1.0))
            if fastest > 1:
                entry = SPEED_ENTRY.get(kernel, kernel)
                where = (("attention_head_width", kernel) if kernel in self.attention_head_width
                         else ("attention_kernels", entry) if kernel != "flash2" else ("attention_efficiency",))
                value = (max(y for _, y in curve) if where[0] == "attention_head_width"
                         else self.attention_kernels[entry] if kernel != "flash2" else self.attention_efficiency)
                raise FieldError(f"{value:g} would run {kernel} attention at {fastest:.3g} of the GPU's peak "
                                 "(attention_efficiency x the kernel's speed x its fastest head-width speed x its "
                                 "forward's rate over its forward + backward rate, 1 where both passes run at one "
                                 "rate; allowed: at most 1)", *where)
        return self

    def attention_speed(self, kernel: str, head_width: float | None = None) -> float:
        """Speed of a flash-attention kernel relative to the FlashAttention-2 curve (1.0 for flash2 / none), at
        ``head_width`` (the width the kernel computes) where ``attention_head_width`` measures the kernel's."""
        speed = self.attention_kernels.get(SPEED_ENTRY.get(kernel, kernel), 1.0)
        curve = self.attention_head_width.get(kernel)   # a kernel's own: flash1_triton's is not flash1's
        if curve is None or head_width is None:
            return speed
        return speed * interpolate_linear(curve, head_width)


class MemoryOverheads(Closed):
    """Memory the ledger of tensors does not show (reference article, rules 6 and 20)."""

    cuda_context: BytesOrZero = 0.0
    workspace: BytesOrZero = 0.0
    comm_buffers: BytesOrZero = 0.0
    fragmentation: Number = Field(0.0, description="fraction of allocated tensor memory lost to the allocator")


class Cost(Closed):
    price_per_gpu_hour: Number | None = Field(None, description="USD per GPU-hour")


class ExplicitDevice(Closed):
    name: str
    node: int = Field(0, ge=0)


class ExplicitSwitch(Closed):
    name: str
    kind: str = "switch"


class ExplicitLink(Closed):
    a: str
    b: str
    bandwidth: Bandwidth = Field(description="per direction")
    latency: Seconds = 0.0
    kind: str = "link"
    efficiency: Fraction = 1.0


class HardwareSpec(Closed):
    """A whole system description: the contents of one ``hardware/*.yaml``."""

    name: str
    description: str = ""
    gpu: GpuSpec
    nodes: PositiveInt = 1
    gpus_per_node: PositiveInt = 8
    intra_node: IntraNode | None = None
    inter_node: InterNode | None = None
    compute: ComputeModel = ComputeModel()
    memory_overheads: MemoryOverheads = MemoryOverheads()
    cost: Cost = Cost()
    host_memory: Bytes | None = Field(None, description="host (CPU) memory of one node, bytes: where offloaded "
                                                        "activations and optimizer state go; absent = not published "
                                                        "for this system")
    host_memory_bandwidth: Bandwidth | None = Field(
        None, description="peak DRAM bandwidth of one node's CPUs, bytes/s: what an offloaded optimizer step "
                          "(parallel.offload_optimizer) streams its state at; absent = not published for this system")
    host_adam_efficiency: Fraction | None = Field(
        None, description="fraction of host_memory_bandwidth a CPU Adam step reaches (a measured CPU-Adam rate over "
                          "its host's peak DRAM bandwidth, plan.offload_optimizer); absent = the step is timed at peak "
                          "DRAM bandwidth, a lower bound on its time")
    devices: list[ExplicitDevice] | None = Field(None, description="explicit form: the GPUs")
    switches: list[ExplicitSwitch] = Field(default_factory=list)
    links: list[ExplicitLink] = Field(default_factory=list)

    @model_validator(mode="after")
    def _form(self) -> HardwareSpec:
        if self.devices is None:
            if self.intra_node is None:
                raise FieldError("a template hardware file needs 'intra_node' (or give an explicit 'devices' list)")
        else:
            if not self.devices:
                raise FieldError("is empty: an explicit topology lists at least one GPU", "devices")
            seen: set[str] = set()
            entries = [("devices", i, d.name) for i, d in enumerate(self.devices)]
            entries += [("switches", i, sw.name) for i, sw in enumerate(self.switches)]
            for section, i, name in entries:
                if name in seen:
                    raise FieldError(f"'{name}' is used twice: device and switch names must be unique",
                                     section, i, "name")
                not_an_internal_name(name, section, i)
                seen.add(name)
            for i, link in enumerate(self.links):
                for end in ("a", "b"):
                    name = getattr(link, end)
                    if name not in seen:
                        raise FieldError(f"link end '{name}' is not a device or switch{suggest(name, sorted(seen))}",
                                         "links", i, end)
            all_joined(self.devices, self.links)
        return self

    @model_validator(mode="after")
    def _curve_fits_latency(self) -> HardwareSpec:
        fabric = self.intra_node
        if fabric is not None and fabric.busbw_curve is not None:
            from simtrain.spec.curves import curve_ramp

            try:
                curve_ramp(fabric.busbw_curve, self.curve_gpus, fabric.latency, fabric.bandwidth * fabric.efficiency)
            except ValueError as err:
                raise FieldError(f"{err} ({self.curve_gpus} GPUs x latency x bandwidth x efficiency over the size "
                                 "must stay below 1 / fraction)", "intra_node", "busbw_curve") from None
        return self

    @model_validator(mode="after")
    def _whole_domain(self) -> HardwareSpec:
        fabric = self.intra_node
        if fabric is not None and fabric.domain_gpus is not None:
            if fabric.domain_gpus % self.gpus_per_node:
                raise FieldError(f"{fabric.domain_gpus} is not a whole number of nodes of {self.gpus_per_node} GPUs "
                                 "(a scale-up domain holds whole nodes)", "intra_node", "domain_gpus")
            if fabric.fabric == "mesh" and fabric.domain_gpus != self.gpus_per_node:
                raise FieldError("a mesh fabric joins the GPUs of one node: domain_gpus must equal gpus_per_node",
                                 "intra_node", "domain_gpus")
        return self

    @property
    def explicit(self) -> bool:
        return self.devices is not None

    @property
    def curve_gpus(self) -> int:
        """GPUs the intra-node bus-bandwidth curve was measured over (the domain unless the file says fewer)."""
        fabric = self.intra_node
        if fabric is not None and fabric.curve_gpus is not None:
            return fabric.curve_gpus
        return self.domain_gpus

    @property
    def domain_gpus(self) -> int:
        """GPUs of one scale-up domain as the file describes it (one node unless ``intra_node.domain_gpus``)."""
        fabric = self.intra_node
        if fabric is not None and fabric.domain_gpus is not None:
            return fabric.domain_gpus
        return self.gpus_per_node

    def overlap_slowdown(self, crosses_network: bool) -> float:
        """Compute slowdown while a collective runs, by the fabric it uses (issue 6, overlap realism)."""
        fabric = self.inter_node if crosses_network else self.intra_node
        own = getattr(fabric, "overlap_slowdown", None) if fabric is not None else None
        return own if own is not None else self.compute.overlap_slowdown


def load_hardware(ref: Any, *, base_dir: Path, file: str | None, field: str = "hardware") -> tuple[HardwareSpec, str]:
    """Resolve ``hardware:`` (bundled name or path) to a spec and the file it came from.

    A path is the user's own, resolved against ``base_dir`` (the scenario's folder); it must be an
    existing ``.yaml``/``.yml`` file. Errors inside the file name that file and its line.
    """
    if not isinstance(ref, str) or not ref.strip():
        raise InputError(f"{ref!r} is not a hardware name or file path", file=file, field=field)
    names = bundled_hardware_names()
    if ref in names:
        path = bundled_hardware_dir() / f"{ref}.yaml"
    elif looks_like_path(ref, base_dir=base_dir, suffixes=(".yaml", ".yml")):
        try:
            path = reference_path(ref, base_dir=base_dir, what="hardware", suffixes=(".yaml", ".yml"))
        except InputError as err:
            raise err.located(file=file, field=field) from None
    else:
        raise InputError(f"unknown hardware '{ref}'{suggest(ref, names)} ({allowed(names)}; or a path to a YAML file)",
                         file=file, field=field)
    stat = Path(path).stat()
    return _parse_hardware(str(path), stat.st_mtime_ns, stat.st_size), str(path)


@lru_cache(maxsize=64)
def _parse_hardware(path: str, _mtime_ns: int, _size: int) -> HardwareSpec:
    """Parse and validate a hardware file, once per file version (specs are immutable): sweeps and
    searches build thousands of scenarios on the same hardware."""
    data = load_yaml(path)
    shown = display_path(Path(path))
    if not isinstance(data, dict):
        raise InputError("a hardware file must hold a mapping (name, gpu, intra_node, ...)", file=shown,
                         line=getattr(data, "line", 1))
    return validate(HardwareSpec, data, file=shown)
