# gen.py OUT_DIR: copies each 05_attention/v*.cu into OUT_DIR as host C++ for the emulator: dynamic shared
# memory becomes the emulator's, launch bounds and <<<...>>> launches are removed, and an entry function
# that runs one thread of the kernel is appended.
import os, re, sys
REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..') + '/'
OUT = sys.argv[1]
entries = {
 'v0_naive': 'void emu_v0(const AttentionParams& p) { attention_v0_naive_kernel(p); }',
 'v1_gqa': 'void emu_v1(const AttentionParams& p, int rows) { with_head_dim_and_rows(p.head_dim, rows, [&](auto hd, auto r) { attention_v1_gqa_kernel<decltype(hd)::value, decltype(r)::value>(p); }); }',
 'v2_split_k': '''void emu_v2(const AttentionParams& p, int rows) { with_head_dim_and_rows(p.head_dim, rows, [&](auto hd, auto r) { attention_v2_split_k_kernel<decltype(hd)::value, decltype(r)::value>(p); }); }
void emu_combine(const AttentionParams& p) { if (p.head_dim == 64) decode_combine_kernel<64>(p); else decode_combine_kernel<128>(p); }''',
 'v3_staged_table': 'void emu_v3(const AttentionParams& p, int rows) { with_head_dim_and_rows(p.head_dim, rows, [&](auto hd, auto r) { attention_v3_staged_table_kernel<decltype(hd)::value, decltype(r)::value>(p); }); }',
 'v4_prefetch': 'void emu_v4(const AttentionParams& p, int rows) { with_head_dim_and_rows(p.head_dim, rows, [&](auto hd, auto r) { attention_v4_prefetch_kernel<decltype(hd)::value, decltype(r)::value>(p); }); }',
 'v5_tensor_core_prefill': 'void emu_v5(const AttentionParams& p) { if (p.head_dim == 64) attention_v5_tensor_core_prefill_kernel<64>(p); else attention_v5_tensor_core_prefill_kernel<128>(p); }',
 'v6_pipelined_decode': 'void emu_v6(const AttentionParams& p, int rows) { with_head_dim_and_rows(p.head_dim, rows, [&](auto hd, auto r) { attention_v6_pipelined_decode_kernel<decltype(hd)::value, decltype(r)::value>(p); }); }',
}
for name, entry in entries.items():
    s = open(REPO + name + '.cu').read()
    s, n = re.subn(r'extern __shared__ __align__\(\d+\) unsigned char smem\[\];', 'unsigned char* const smem = ::emu::dynamic_smem();', s)
    s = re.sub(r'__launch_bounds__\([^)]*\)', '', s)
    s = re.sub(r'\s*<<<.*?>>>', '', s, flags=re.S)
    s += '\nnamespace nanovllm {\n' + entry + '\n}\n'
    open(os.path.join(OUT, name + '.cpp'), 'w').write(s)
