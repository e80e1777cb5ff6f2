#!/bin/bash
# The device check of 2026-11-30, run on a lent H200 from the repository's root
# (bash bench/h200/device_check_2026-11-30.sh; $OUT: a folder whose files come back). Two parts:
# 1. allocation histories of what the allocation model learnt since the last GPU (losses MSE and L1, a layer called
#    twice, CycleGAN's instance norms and in-place ReLUs): bench_allocator_history.py record, four at a time;
# 2. the largest batch that fits: the nvml profile of eight of the H100's descriptions at batch 768-2048, ascending
#    until the first out of memory, appended to bench/h200's rows (32/128/512 are measured already), stopped by
#    SIGINT after PROFILE_S seconds (rows taken so far are kept).
set -u
export PYTHONUNBUFFERED=1
PROFILE_S=${PROFILE_S:-300}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
python3 -c "import torch, pynvml; print('torch', torch.__version__, 'cudnn', torch.backends.cudnn.version())"

H=$OUT/hist; mkdir -p $H
R="python3 bench/bench_allocator_history.py record --out $H"
start=$SECONDS
$R --models bench/h200/models --network cbam_resnet18 --batch-size 64 256 &
$R --models bench/h200/models --network cyclegan_generator --batch-size 4 16 --loss l1 &
$R --models bench/h100/models --network resnet18_l0 --batch-size 64 --loss mse &
$R --models bench/h100/models --network resnet18_l0 --batch-size 64 --loss l1 &
wait
echo "histories: $((SECONDS - start)) s"
tar -C $OUT -czf $OUT/hist.tar.gz hist && rm -rf $H

W=/tmp/oom; rm -rf $W; mkdir -p $W
cp -r bench/h100/models $W/models
cp -r bench/h200/profiling_csvs $W/profiling_csvs
python3 - <<'PY'
import csv
order = ["densenet121_l0", "gen_0_5", "vgg11_l0", "resnet50_l0", "densenet121_l40", "mobilenet_v2_l0", "gen_0_0",
         "gen_0_1"]
rows = []
for path in ("/tmp/oom/models/manifest.csv",):
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        fields, rows = reader.fieldnames, list(reader)
keep = sorted((r for r in rows if r["network"] in order), key=lambda r: order.index(r["network"]))
with open("/tmp/oom/models/manifest.csv", "w", newline="") as f:
    w = csv.DictWriter(f, fields)
    w.writeheader()
    w.writerows(keep)
print("profiling", [r["network"] for r in keep])
PY
SIZES='batch_sizes = [32, 128, 512, 768, 1024, 1280, 1536, 1792, 2048]'
sed -e 's#^models_dir = .*#models_dir = "models"#' -e "s#^batch_sizes = .*#$SIZES#" bench/h200/config.toml > $W/config.toml
start=$SECONDS
timeout -s INT $PROFILE_S python3 main.py --config $W/config.toml --stage profile
echo "profile: rc $?, $((SECONDS - start)) s"
cp $W/profiling_csvs/h200/measurements.csv $OUT/measurements.csv
ls -la $OUT
