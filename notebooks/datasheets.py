"""What the data sheets and the instruction set say a machine can do: peak FLOP per cycle of
a CPU core, from its vector flags and model number, and the GPUs' rated FLOP/s and memory
bandwidth. hardware.py measures; this module states what the measurements are held against.
"""
import platform
import re
from dataclasses import dataclass

from stats import NOISE_FLOOR


def _this_cpu():
    import hardware  # hardware imports this module: look the CPU up only when asked
    return hardware.cpu_info()


# ---------------------------------------------------------- vector units and peaks
@dataclass(frozen=True)
class Microarchitecture:
    name: str
    vector: str                     # 'AVX-512', 'AVX2', 'AVX', 'NEON', or 'unknown'
    fma_units: int                  # vector FMA pipes per core (0: no FMA)
    fp32_flops_per_cycle: int       # per core: FMA pipes x fp32 lanes x 2 (None: unknown)
    evidence: str                   # how it was decided, for the reader


# Intel family-6 model numbers whose AVX-512 cores have one 512-bit FMA pipe (client parts)
# and two (server parts); Skylake-SP's 1-pipe Silver, Bronze and Gold 5 parts go by name.
INTEL_ONE_FMA = {125: 'Ice Lake (client)', 126: 'Ice Lake (client)',
                 140: 'Tiger Lake', 141: 'Tiger Lake', 167: 'Rocket Lake'}
INTEL_TWO_FMA = {85: 'Skylake-SP / Cascade Lake', 106: 'Ice Lake-SP', 108: 'Ice Lake-SP',
                 143: 'Sapphire Rapids', 207: 'Emerald Rapids', 173: 'Granite Rapids',
                 174: 'Granite Rapids'}


# AMD families: (name, FMA pipes, fp32 lanes a pipe). Zen 4 (family 25 with AVX-512) runs
# each 512-bit instruction as two 256-bit halves, so its pipes have 8 fp32 lanes, not 16.
def _amd(family, model_number, avx512):
    if family == 23:
        return ('Zen / Zen+', 2, 4) if model_number < 0x30 else ('Zen 2', 2, 8)
    if family == 25:
        return ('Zen 4', 2, 8) if avx512 else ('Zen 3', 2, 8)
    if family == 26:  # mobile Zen 5 (Strix Point, Krackan Point) has 256-bit pipes
        if 0x20 <= model_number < 0x30 or 0x60 <= model_number < 0x70:
            return 'Zen 5 (mobile)', 2, 8
        return 'Zen 5', 2, 16 if avx512 else 8
    return f'AMD family {family}', 2, 8


def microarchitecture(info=None):
    """The vector units of `info`'s cores (default: this machine's), and their fp32 FLOP per
    cycle, with the evidence. A 512-bit FMA on Zen 4 runs as two 256-bit halves, so Zen 4
    retires 32 fp32 FLOP per cycle, not AVX-512's nominal 64."""
    info = info or _this_cpu()
    f, fam, num = info.flags, info.family, info.model_number
    vector = ('AVX-512' if 'avx512f' in f else 'AVX2' if 'avx2' in f else 'AVX' if 'avx' in f
              else 'NEON' if {'asimd', 'neon'} & f else 'unknown')
    fma = 'fma' in f or 'asimd' in f
    lanes = {'AVX-512': 16, 'AVX2': 8, 'AVX': 8, 'NEON': 4}.get(vector)
    said = f'flags {vector}' + (' with FMA' if fma else '')
    if info.vendor == 'AuthenticAMD' and fam:
        name, units, width = _amd(fam, num or 0, vector == 'AVX-512')
        evidence = (f'{said}; AMD family {fam}, model {num}: {name}'
                    + (', whose 512-bit instructions run as two 256-bit halves'
                       if name in ('Zen 4', 'Zen 5 (mobile)') else ''))
        return Microarchitecture(name, vector, units, units * width * 2, evidence)
    if info.vendor == 'GenuineIntel' and vector == 'AVX-512':
        if 'amx_tile' in f:
            known = INTEL_TWO_FMA.get(num) if num in (143, 207, 173, 174) else None
            name = known or 'Sapphire Rapids or newer'
            evidence = f'{said} and AMX: Sapphire Rapids or newer, two 512-bit FMA pipes a core'
            if not known:  # a virtual machine may report another model number
                evidence += f' (reported model number, {num}, unknown: the flags decide)'
            return Microarchitecture(name, vector, 2, 64, evidence)
        if num in INTEL_ONE_FMA:
            return Microarchitecture(INTEL_ONE_FMA[num], vector, 1, 32,
                                     f'{said}; Intel model {num}: one 512-bit FMA pipe a core')
        if num in INTEL_TWO_FMA:
            one = num == 85 and re.search(r'Silver|Bronze|Gold 5', info.model)
            return Microarchitecture(INTEL_TWO_FMA[num], vector, 1 if one else 2,
                                     32 if one else 64,
                                     f'{said}; Intel model {num}' + (
                                         f', {info.model}: one FMA pipe' if one else
                                         ': two 512-bit FMA pipes a core'))
        return Microarchitecture('unknown AVX-512 core', vector, 2, 64,
                                 f'{said}; model {num} unknown: two FMA pipes, an upper bound')
    if lanes is None:
        return Microarchitecture('unknown', vector, 0, None,
                                 f'no known vector flags on {platform.machine()}')
    units = 2 if fma else 1
    per_cycle = units * lanes * 2 if fma else 2 * lanes  # without FMA: one add and one mul pipe
    return Microarchitecture(f'{info.vendor or platform.machine()} {vector} core', vector,
                             units if fma else 0, per_cycle,
                             f'{said}: {units} pipe(s) of {lanes} fp32 lanes assumed')


def flops_per_cycle(precision, info=None):
    """Peak FLOP per cycle and core in `precision`: float64 has half float32's lanes; bf16
    doubles float32's rate with its dot-product instruction (avx512_bf16), fp16 with its own
    arithmetic on 32 lanes (avx512_fp16), and both reach 1024 with AMX tiles; without such
    instructions they convert to float32 and float32's rate is their ceiling."""
    info = info or _this_cpu()
    fp32 = microarchitecture(info).fp32_flops_per_cycle
    if fp32 is None:
        return None
    half = lambda dot, amx: 1024 if amx in info.flags else 2 * fp32 if dot in info.flags else fp32
    return {'float32': fp32, 'float64': fp32 // 2, 'tf32': fp32,
            'bfloat16': half('avx512_bf16', 'amx_bf16'),
            'float16': half('avx512_fp16', 'amx_fp16')}[precision]


def peak_flops(precision, ghz, info=None):
    """Peak FLOP/s of all physical cores at `ghz` (None where unknown)."""
    info = info or _this_cpu()
    per_cycle = flops_per_cycle(precision, info)
    cores = info.physical_cores or info.logical_cores
    return None if per_cycle is None or ghz is None else per_cycle * cores * ghz * 1e9


# ------------------------------------------------------- GPUs, from their data sheets
# Dense peak TFLOP/s from NVIDIA's data sheets, per precision (None where the sheet gives
# none), and memory GB/s. The fp64 figure is the fastest fp64 path the sheet states: on
# A100, H100 and H200 that is the fp64 tensor cores, whose rate happens to equal the fp32
# one, so equal roofs there do not mean a missing instruction.
# Keys are whole model names as CUDA reports them, less the vendor prefix: 'L4' must not
# match an L40S, nor 'H100 80GB HBM3' (SXM) an H100 NVL. (Added for notebook 04.)
GPU_PRECISIONS = ('float64', 'float32', 'tf32', 'bfloat16', 'float16')
GPU_SPECS = {
    'T4': ((None, 8.1, None, None, 65), 320),
    'L4': ((None, 30.3, 60, 121, 121), 300),
    'L40S': ((None, 91.6, 183, 362, 362), 864),
    'V100-SXM2-16GB': ((7.8, 15.7, None, None, 125), 900),
    'V100-SXM2-32GB': ((7.8, 15.7, None, None, 125), 900),
    'V100-PCIE-16GB': ((7, 14, None, None, 112), 900),
    'V100-PCIE-32GB': ((7, 14, None, None, 112), 900),
    'A100-SXM4-40GB': ((19.5, 19.5, 156, 312, 312), 1555),
    'A100-SXM4-80GB': ((19.5, 19.5, 156, 312, 312), 2039),
    'A100-PCIE-40GB': ((19.5, 19.5, 156, 312, 312), 1555),
    'A100 80GB PCIe': ((19.5, 19.5, 156, 312, 312), 1935),
    'H100 80GB HBM3': ((67, 67, 494.7, 989.4, 989.4), 3350),
    'H100 PCIe': ((51, 51, 378, 756, 756), 2000),
    'H100 NVL': ((60, 60, 417.5, 835.5, 835.5), 3900),
    'H200': ((67, 67, 494.7, 989.4, 989.4), 4800),
}


def gpu_spec(device_name):
    """(model, (peak TFLOP/s per GPU_PRECISIONS, memory GB/s)) for a name as CUDA reports it
    ('NVIDIA H100 NVL', 'Tesla T4'), or (None, None) for a GPU not in GPU_SPECS."""
    model = re.sub(r'^(NVIDIA|Tesla)\s+', '', device_name.strip())
    return (model, GPU_SPECS[model]) if model in GPU_SPECS else (None, None)


def gpu_peak_flops(device_name, precision):
    """The data sheet's dense peak FLOP/s of that GPU in `precision`, or None (not stated, or
    a GPU not in GPU_SPECS)."""
    _, spec = gpu_spec(device_name)
    tflops = spec and spec[0][GPU_PRECISIONS.index(precision)]
    return tflops * 1e12 if tflops else None


def gpu_memory_gbs(device_name):
    """The data sheet's memory bandwidth of that GPU in GB/s, or None."""
    _, spec = gpu_spec(device_name)
    return spec[1] if spec else None


def roof_clock(nominal_ghz, reported_max_ghz=None, implied_ghz=None):
    """(GHz, why) at which notebook 04 draws a CPU's flat roofs: the maximum clock where the
    system reports one; otherwise the higher of the nominal clock and the clock the measured
    products imply, so that no measurement sits above its roof. An implied clock within the
    noise floor of nominal is called nominal. (None, why) when no clock is known."""
    if reported_max_ghz:
        return reported_max_ghz, 'reported maximum'
    known = [g for g in (nominal_ghz, implied_ghz) if g]
    if not known:
        return None, 'no clock known'
    if nominal_ghz and implied_ghz and implied_ghz > (1 + NOISE_FLOOR) * nominal_ghz:
        return implied_ghz, 'the clock the products imply (above nominal)'
    return max(known), 'about the nominal clock (no maximum reported)'
