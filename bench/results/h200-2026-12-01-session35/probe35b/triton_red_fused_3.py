
import triton
import triton.language as tl

from torch._inductor.runtime import triton_helpers, triton_heuristics
from torch._inductor.runtime.triton_helpers import libdevice, math as tl_math
from torch._inductor.runtime.hints import AutotuneHint, ReductionHint, TileHint, DeviceProperties

@triton_heuristics.reduction(
    size_hints={'x': 4096, 'r0_': 1024},
    reduction_hint=ReductionHint.DEFAULT,
    filename=__file__,
    triton_meta={'signature': {'in_out_ptr0': '*fp32', 'in_out_ptr1': '*fp32', 'in_ptr0': '*i64', 'in_ptr1': '*fp32', 'in_ptr2': '*i64', 'in_ptr3': '*fp32', 'in_ptr4': '*fp32', 'in_ptr5': '*fp32', 'in_ptr6': '*fp32', 'in_ptr7': '*fp32', 'out_ptr0': '*i1', 'out_ptr1': '*fp32', 'out_ptr3': '*i1', 'out_ptr4': '*fp32', 'out_ptr5': '*bf16', 'out_ptr6': '*fp32', 'out_ptr8': '*i1', 'out_ptr10': '*i1', 'out_ptr12': '*i1', 'out_ptr14': '*i1', 'out_ptr16': '*i1', 'out_ptr18': '*i1', 'out_ptr20': '*i1', 'out_ptr22': '*i1', 'out_ptr24': '*i1', 'out_ptr26': '*i1', 'out_ptr28': '*i1', 'out_ptr30': '*i1', 'out_ptr32': '*bf16', 'out_ptr33': '*bf16', 'out_ptr34': '*bf16', 'out_ptr35': '*bf16', 'out_ptr36': '*bf16', 'out_ptr37': '*bf16', 'out_ptr38': '*bf16', 'out_ptr39': '*bf16', 'out_ptr40': '*bf16', 'out_ptr41': '*bf16', 'out_ptr42': '*bf16', 'out_ptr43': '*bf16', 'load_seed_offset': 'i32', 'load_seed_offset1': 'i32', 'load_seed_offset2': 'i32', 'load_seed_offset3': 'i32', 'load_seed_offset4': 'i32', 'load_seed_offset5': 'i32', 'load_seed_offset6': 'i32', 'load_seed_offset7': 'i32', 'load_seed_offset8': 'i32', 'load_seed_offset9': 'i32', 'load_seed_offset10': 'i32', 'load_seed_offset11': 'i32', 'load_seed_offset12': 'constexpr', 'XBLOCK': 'constexpr', 'R0_BLOCK': 'constexpr'}, 'device': DeviceProperties(type='cuda', index=0, multi_processor_count=132, cc=90, major=9, regs_per_multiprocessor=65536, max_threads_per_multi_processor=2048, max_threads_per_block=1024, warp_size=32), 'constants': {'load_seed_offset12': 1}, 'enable_fp_fusion': True, 'configs': [{(0,): [['tt.divisibility', 16]], (1,): [['tt.divisibility', 16]], (2,): [['tt.divisibility', 16]], (3,): [['tt.divisibility', 16]], (4,): [['tt.divisibility', 16]], (5,): [['tt.divisibility', 16]], (6,): [['tt.divisibility', 16]], (7,): [['tt.divisibility', 16]], (8,): [['tt.divisibility', 16]], (9,): [['tt.divisibility', 16]], (10,): [['tt.divisibility', 16]], (11,): [['tt.divisibility', 16]], (12,): [['tt.divisibility', 16]], (13,): [['tt.divisibility', 16]], (14,): [['tt.divisibility', 16]], (15,): [['tt.divisibility', 16]], (16,): [['tt.divisibility', 16]], (17,): [['tt.divisibility', 16]], (18,): [['tt.divisibility', 16]], (19,): [['tt.divisibility', 16]], (20,): [['tt.divisibility', 16]], (21,): [['tt.divisibility', 16]], (22,): [['tt.divisibility', 16]], (23,): [['tt.divisibility', 16]], (24,): [['tt.divisibility', 16]], (25,): [['tt.divisibility', 16]], (26,): [['tt.divisibility', 16]], (27,): [['tt.divisibility', 16]], (28,): [['tt.divisibility', 16]], (29,): [['tt.divisibility', 16]], (30,): [['tt.divisibility', 16]], (31,): [['tt.divisibility', 16]], (32,): [['tt.divisibility', 16]], (33,): [['tt.divisibility', 16]], (34,): [['tt.divisibility', 16]], (35,): [['tt.divisibility', 16]], (36,): [['tt.divisibility', 16]], (37,): [['tt.divisibility', 16]], (38,): [['tt.divisibility', 16]], (39,): [['tt.divisibility', 16]]}]},
    inductor_meta={'grid_type': 'SequentialComboKernelGrid', 'combo_grid_meta': {'num_kernels': 2, 'min_blocks': 0, 'default_config': None, 'no_x_dim_0': False, 'xnumel_0': 4096, 'no_x_dim_1': None, 'xnumel_1': 512}, 'kernel_name': 'triton_red_fused_3', 'mutated_arg_names': ['in_out_ptr0', 'in_out_ptr1'], 'backend_hash': '91D1D1166449D9E2EB66EB9770C9E2C3B0FEB787341F27FEB4D3F0338DA50336', 'assert_indirect_indexing': True, 'autotune_local_cache': True, 'autotune_pointwise': True, 'autotune_remote_cache': None, 'force_disable_caches': False, 'dynamic_scale_rblock': True, 'max_autotune': False, 'max_autotune_pointwise': False, 'min_split_scan_rblock': 256, 'spill_threshold': 16, 'store_cubin': False, 'deterministic': False, 'force_filter_reduction_configs': False, 'mix_order_reduction_allow_multi_stages': False, 'are_deterministic_algorithms_enabled': False}
)
@triton.jit
def triton_red_fused_3(in_out_ptr0, in_out_ptr1, in_ptr0, in_ptr1, in_ptr2, in_ptr3, in_ptr4, in_ptr5, in_ptr6, in_ptr7, out_ptr0, out_ptr1, out_ptr3, out_ptr4, out_ptr5, out_ptr6, out_ptr8, out_ptr10, out_ptr12, out_ptr14, out_ptr16, out_ptr18, out_ptr20, out_ptr22, out_ptr24, out_ptr26, out_ptr28, out_ptr30, out_ptr32, out_ptr33, out_ptr34, out_ptr35, out_ptr36, out_ptr37, out_ptr38, out_ptr39, out_ptr40, out_ptr41, out_ptr42, out_ptr43, load_seed_offset, load_seed_offset1, load_seed_offset2, load_seed_offset3, load_seed_offset4, load_seed_offset5, load_seed_offset6, load_seed_offset7, load_seed_offset8, load_seed_offset9, load_seed_offset10, load_seed_offset11, load_seed_offset12, XBLOCK : tl.constexpr, R0_BLOCK : tl.constexpr):
    pid = tl.program_id(0)
    num_xblocks_0 = tl.cdiv(4096, XBLOCK)
    num_xblocks_1 = num_xblocks_0 + tl.cdiv(512, XBLOCK)
    if pid < num_xblocks_0:
        pid_offset = pid
        xnumel = 4096
        r0_numel = 768
        rnumel = r0_numel
        RBLOCK: tl.constexpr = R0_BLOCK
        xoffset = pid_offset * XBLOCK
        xindex = xoffset + tl.arange(0, XBLOCK)[:, None]
        xmask = xindex < xnumel
        r0_base = tl.arange(0, R0_BLOCK)[None, :]
        rbase = r0_base
        x0 = xindex
        tmp0 = tl.load(in_ptr0 + (x0), xmask, eviction_policy='evict_last')
        tmp1 = tl.full([1, 1], 0, tl.int64)
        tmp2 = tmp0 == tmp1
        tl.store(out_ptr0 + (x0), tmp2, xmask)
        tmp10_mean = tl.zeros([XBLOCK, R0_BLOCK], tl.float32)
        tmp10_m2 = tl.zeros([XBLOCK, R0_BLOCK], tl.float32)
        tmp10_weight = tl.zeros([XBLOCK, R0_BLOCK], tl.float32)
        for r0_offset in tl.range(0, r0_numel, R0_BLOCK):
            r0_index = r0_offset + r0_base
            r0_mask = r0_index < r0_numel
            roffset = r0_offset
            rindex = r0_index
            r0_1 = r0_index
            tmp3 = tl.full([1, 1], 128100, tl.int32)
            tmp4 = tmp0 + tmp3
            tmp5 = tmp0 < 0
            tmp6 = tl.where(tmp5, tmp4, tmp0)
            tl.device_assert(((0 <= tmp6) & (tmp6 < 128100)) | ~(xmask), "index out of bounds: 0 <= tmp6 < 128100")
            tmp8 = tl.load(in_ptr1 + (r0_1 + 768*tmp6), r0_mask & xmask, eviction_policy='evict_last', other=0.0)
            tmp9 = tl.broadcast_to(tmp8, [XBLOCK, R0_BLOCK])
            tmp10_mean_next, tmp10_m2_next, tmp10_weight_next = triton_helpers.welford_reduce(
                tmp9, tmp10_mean, tmp10_m2, tmp10_weight, roffset == 0
            )
            tmp10_mean = tl.where(r0_mask & xmask, tmp10_mean_next, tmp10_mean)
            tmp10_m2 = tl.where(r0_mask & xmask, tmp10_m2_next, tmp10_m2)
            tmp10_weight = tl.where(r0_mask & xmask, tmp10_weight_next, tmp10_weight)
        tmp11, tmp12, tmp13 = triton_helpers.welford(tmp10_mean, tmp10_m2, tmp10_weight, 1)
        tmp10 = tmp11[:, None]
        tmp14 = tmp12[:, None]
        tmp15 = tmp13[:, None]
        tl.store(out_ptr1 + (x0), tmp10, xmask)
        tmp16 = tl.full([1, 1], 768.0, tl.float32)
        tmp17 = (tmp14 / tmp16)
        tmp18 = tl.full([1, 1], 1e-07, tl.float32)
        tmp19 = tmp17 + tmp18
        tmp20 = libdevice.rsqrt(tmp19)
        tl.debug_barrier()
        tl.store(in_out_ptr0 + (x0), tmp20, xmask)
        for r0_offset in tl.range(0, r0_numel, R0_BLOCK):
            r0_index = r0_offset + r0_base
            r0_mask = r0_index < r0_numel
            roffset = r0_offset
            rindex = r0_index
            r0_1 = r0_index
            tmp35 = tl.load(in_ptr3 + (r0_1), r0_mask, eviction_policy='evict_last', other=0.0)
            tmp37 = tl.load(in_ptr4 + (r0_1), r0_mask, eviction_policy='evict_last', other=0.0)
            tmp21 = tl.load(in_ptr2 + load_seed_offset)
            tmp22 = r0_1 + 768*x0
            tmp23 = tl.rand(tmp21, (tmp22).to(tl.uint32))
            tmp24 = tl.full([1, 1], 0.1, tl.float32)
            tmp25 = tmp23 > tmp24
            tmp26 = tmp25.to(tl.float32)
            tmp27 = tl.full([1, 1], 128100, tl.int32)
            tmp28 = tmp0 + tmp27
            tmp29 = tmp0 < 0
            tmp30 = tl.where(tmp29, tmp28, tmp0)
            tl.device_assert(((0 <= tmp30) & (tmp30 < 128100)) | ~(xmask), "index out of bounds: 0 <= tmp30 < 128100")
            tmp32 = tl.load(in_ptr1 + (r0_1 + 768*tmp30), r0_mask & xmask, eviction_policy='evict_first', other=0.0)
            tmp33 = tmp32 - tmp10
            tmp34 = tmp33 * tmp20
            tmp36 = tmp34 * tmp35
            tmp38 = tmp36 + tmp37
            tmp39 = tmp26 * tmp38
            tmp40 = tl.full([1, 1], 1.1111111111111112, tl.float32)
            tmp41 = tmp39 * tmp40
            tmp42 = tmp41.to(tl.float32)
            tl.store(out_ptr3 + (r0_1 + 768*x0), tmp25, r0_mask & xmask)
            tl.store(out_ptr4 + (r0_1 + 768*x0), tmp41, r0_mask & xmask)
            tl.store(out_ptr5 + (r0_1 + 768*x0), tmp42, r0_mask & xmask)
    elif pid < num_xblocks_1:
        pid_offset = pid - num_xblocks_0
        xnumel = 512
        r0_numel = 768
        R0_BLOCK_1: tl.constexpr = 1024
        rnumel = r0_numel
        RBLOCK: tl.constexpr = R0_BLOCK_1
        xoffset = pid_offset * XBLOCK
        xindex = xoffset + tl.arange(0, XBLOCK)[:, None]
        xmask = xindex < xnumel
        r0_index = tl.arange(0, R0_BLOCK_1)[None, :]
        r0_offset = 0
        r0_mask = r0_index < r0_numel
        roffset = r0_offset
        rindex = r0_index
        r0_3 = r0_index
        x2 = xindex
        tmp43 = tl.load(in_ptr5 + (r0_3 + 768*x2), r0_mask & xmask, other=0.0)
        tmp105 = tl.load(in_ptr6 + (r0_3), r0_mask, eviction_policy='evict_last', other=0.0)
        tmp107 = tl.load(in_ptr7 + (r0_3), r0_mask, eviction_policy='evict_last', other=0.0)
        tmp44 = tl.broadcast_to(tmp43, [XBLOCK, R0_BLOCK_1])
        tmp46 = tl.where(r0_mask & xmask, tmp44, 0)
        tmp47 = tl.broadcast_to(tmp44, [XBLOCK, R0_BLOCK_1])
        tmp49 = tl.where(r0_mask & xmask, tmp47, 0)
        tmp50 = tl.sum(tmp49, 1)[:, None].to(tl.float32)
        tmp51 = tl.full([1, 1], 768, tl.int32)
        tmp52 = tmp51.to(tl.float32)
        tmp53 = (tmp50 / tmp52)
        tmp54 = tmp44 - tmp53
        tmp55 = tmp54 * tmp54
        tmp56 = tl.broadcast_to(tmp55, [XBLOCK, R0_BLOCK_1])
        tmp58 = tl.where(r0_mask & xmask, tmp56, 0)
        tmp59 = tl.sum(tmp58, 1)[:, None].to(tl.float32)
        tmp60 = tl.full([1, 1], 768.0, tl.float32)
        tmp61 = (tmp59 / tmp60)
        tmp62 = tl.full([1, 1], 1e-07, tl.float32)
        tmp63 = tmp61 + tmp62
        tmp64 = libdevice.rsqrt(tmp63)
        tmp65 = tl.load(in_ptr2 + load_seed_offset1)
        tmp66 = r0_3 + 768*x2
        tmp67 = tl.rand(tmp65, (tmp66).to(tl.uint32))
        tmp68 = tl.full([1, 1], 0.1, tl.float32)
        tmp69 = tmp67 > tmp68
        tmp70 = tl.load(in_ptr2 + load_seed_offset2)
        tmp71 = tl.rand(tmp70, (tmp66).to(tl.uint32))
        tmp72 = tmp71 > tmp68
        tmp73 = tl.load(in_ptr2 + load_seed_offset3)
        tmp74 = tl.rand(tmp73, (tmp66).to(tl.uint32))
        tmp75 = tmp74 > tmp68
        tmp76 = tl.load(in_ptr2 + load_seed_offset4)
        tmp77 = tl.rand(tmp76, (tmp66).to(tl.uint32))
        tmp78 = tmp77 > tmp68
        tmp79 = tl.load(in_ptr2 + load_seed_offset5)
        tmp80 = tl.rand(tmp79, (tmp66).to(tl.uint32))
        tmp81 = tmp80 > tmp68
        tmp82 = tl.load(in_ptr2 + load_seed_offset6)
        tmp83 = tl.rand(tmp82, (tmp66).to(tl.uint32))
        tmp84 = tmp83 > tmp68
        tmp85 = tl.load(in_ptr2 + load_seed_offset7)
        tmp86 = tl.rand(tmp85, (tmp66).to(tl.uint32))
        tmp87 = tmp86 > tmp68
        tmp88 = tl.load(in_ptr2 + load_seed_offset8)
        tmp89 = tl.rand(tmp88, (tmp66).to(tl.uint32))
        tmp90 = tmp89 > tmp68
        tmp91 = tl.load(in_ptr2 + load_seed_offset9)
        tmp92 = tl.rand(tmp91, (tmp66).to(tl.uint32))
        tmp93 = tmp92 > tmp68
        tmp94 = tl.load(in_ptr2 + load_seed_offset10)
        tmp95 = tl.rand(tmp94, (tmp66).to(tl.uint32))
        tmp96 = tmp95 > tmp68
        tmp97 = tl.load(in_ptr2 + load_seed_offset11)
        tmp98 = tl.rand(tmp97, (tmp66).to(tl.uint32))
        tmp99 = tmp98 > tmp68
        tmp100 = tl.load(in_ptr2 + load_seed_offset12)
        tmp101 = tl.rand(tmp100, (tmp66).to(tl.uint32))
        tmp102 = tmp101 > tmp68
        tmp103 = tmp43 - tmp53
        tmp104 = tmp103 * tmp64
        tmp106 = tmp104 * tmp105
        tmp108 = tmp106 + tmp107
        tmp109 = tmp102.to(tl.float32)
        tmp110 = tmp109 * tmp108
        tmp111 = tl.full([1, 1], 1.1111111111111112, tl.float32)
        tmp112 = tmp110 * tmp111
        tmp113 = tmp112.to(tl.float32)
        tmp114 = tmp99.to(tl.float32)
        tmp115 = tmp114 * tmp108
        tmp116 = tmp115 * tmp111
        tmp117 = tmp116.to(tl.float32)
        tmp118 = tmp96.to(tl.float32)
        tmp119 = tmp118 * tmp108
        tmp120 = tmp119 * tmp111
        tmp121 = tmp120.to(tl.float32)
        tmp122 = tmp93.to(tl.float32)
        tmp123 = tmp122 * tmp108
        tmp124 = tmp123 * tmp111
        tmp125 = tmp124.to(tl.float32)
        tmp126 = tmp90.to(tl.float32)
        tmp127 = tmp126 * tmp108
        tmp128 = tmp127 * tmp111
        tmp129 = tmp128.to(tl.float32)
        tmp130 = tmp87.to(tl.float32)
        tmp131 = tmp130 * tmp108
        tmp132 = tmp131 * tmp111
        tmp133 = tmp132.to(tl.float32)
        tmp134 = tmp84.to(tl.float32)
        tmp135 = tmp134 * tmp108
        tmp136 = tmp135 * tmp111
        tmp137 = tmp136.to(tl.float32)
        tmp138 = tmp81.to(tl.float32)
        tmp139 = tmp138 * tmp108
        tmp140 = tmp139 * tmp111
        tmp141 = tmp140.to(tl.float32)
        tmp142 = tmp78.to(tl.float32)
        tmp143 = tmp142 * tmp108
        tmp144 = tmp143 * tmp111
        tmp145 = tmp144.to(tl.float32)
        tmp146 = tmp75.to(tl.float32)
        tmp147 = tmp146 * tmp108
        tmp148 = tmp147 * tmp111
        tmp149 = tmp148.to(tl.float32)
        tmp150 = tmp72.to(tl.float32)
        tmp151 = tmp150 * tmp108
        tmp152 = tmp151 * tmp111
        tmp153 = tmp152.to(tl.float32)
        tmp154 = tmp69.to(tl.float32)
        tmp155 = tmp154 * tmp108
        tmp156 = tmp155 * tmp111
        tmp157 = tmp156.to(tl.float32)
        tl.debug_barrier()
        tl.store(in_out_ptr1 + (x2), tmp64, xmask)
        tl.store(out_ptr8 + (r0_3 + 768*x2), tmp69, r0_mask & xmask)
        tl.store(out_ptr10 + (r0_3 + 768*x2), tmp72, r0_mask & xmask)
        tl.store(out_ptr12 + (r0_3 + 768*x2), tmp75, r0_mask & xmask)
        tl.store(out_ptr14 + (r0_3 + 768*x2), tmp78, r0_mask & xmask)
        tl.store(out_ptr16 + (r0_3 + 768*x2), tmp81, r0_mask & xmask)
        tl.store(out_ptr18 + (r0_3 + 768*x2), tmp84, r0_mask & xmask)
        tl.store(out_ptr20 + (r0_3 + 768*x2), tmp87, r0_mask & xmask)
        tl.store(out_ptr22 + (r0_3 + 768*x2), tmp90, r0_mask & xmask)
        tl.store(out_ptr24 + (r0_3 + 768*x2), tmp93, r0_mask & xmask)
        tl.store(out_ptr26 + (r0_3 + 768*x2), tmp96, r0_mask & xmask)
        tl.store(out_ptr28 + (r0_3 + 768*x2), tmp99, r0_mask & xmask)
        tl.store(out_ptr30 + (r0_3 + 768*x2), tmp102, r0_mask & xmask)
        tl.store(out_ptr32 + (r0_3 + 768*x2), tmp113, r0_mask & xmask)
        tl.store(out_ptr33 + (r0_3 + 768*x2), tmp117, r0_mask & xmask)
        tl.store(out_ptr34 + (r0_3 + 768*x2), tmp121, r0_mask & xmask)
        tl.store(out_ptr35 + (r0_3 + 768*x2), tmp125, r0_mask & xmask)
        tl.store(out_ptr36 + (r0_3 + 768*x2), tmp129, r0_mask & xmask)
        tl.store(out_ptr37 + (r0_3 + 768*x2), tmp133, r0_mask & xmask)
        tl.store(out_ptr38 + (r0_3 + 768*x2), tmp137, r0_mask & xmask)
        tl.store(out_ptr39 + (r0_3 + 768*x2), tmp141, r0_mask & xmask)
        tl.store(out_ptr40 + (r0_3 + 768*x2), tmp145, r0_mask & xmask)
        tl.store(out_ptr41 + (r0_3 + 768*x2), tmp149, r0_mask & xmask)
        tl.store(out_ptr42 + (r0_3 + 768*x2), tmp153, r0_mask & xmask)
        tl.store(out_ptr43 + (r0_3 + 768*x2), tmp157, r0_mask & xmask)
        tl.store(out_ptr6 + (x2), tmp53, xmask)
    else:
        pass
