#!/usr/bin/env bash
# session 29, call B: the 125M model (split SwiGLU) 40 steps in FP8, then in bf16 with train.share_buffers
set -u
O=${OUT:-/tmp/out}; R=/tmp/r; mkdir -p $R
W=/tmp/train_work; mkdir -p $W
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib:/usr/local/cuda-13.0/targets/x86_64-linux/lib
export FUSEBOX_SOURCE_DIR=$PWD FUSEBOX_DEVPROP=$PWD/devices/h200-cudnn-9.27.devprop PYTHONPATH=$PWD/python FUSEBOX_CACHE=$W/plans.sqlite
for f in fusebox; do xz -dc ".gpu-train/$f.xz" > "$W/$f" && chmod +x "$W/$f"; done
[ -d "$W/lm" ] || tar -C "$W" -xJf .gpu-train/lm.tar.xz
FB=$W/fusebox
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a $R/gpu_b.txt
pack() { tar czf "$O/rb.tgz" -C $R . 2>/dev/null; }
med() { python3 -c 'import csv,statistics,sys; r=list(csv.DictReader(open(sys.argv[1]))); print("median tokens/s steps 5+:", statistics.median(float(x["tokens_per_s"]) for x in r[5:]), "last loss", r[-1]["loss"])' "$1"; }
if [ "${ONLYSHARE:-0}" != 1 ]; then
rm -rf $W/f8
timeout 120 $FB train lm --config examples/train/lm_125m.json --data $W/lm --steps 20 --out $W/f8 --backend gpu --fp8 --no-plot --generate 0 > $R/m125_fp8.txt 2>&1
echo "125M fp8 rc $?" >> $R/gpu_b.txt; grep -E "^start-up|^GPU|^model|validation|error|Error" $R/m125_fp8.txt | head -8 >> $R/gpu_b.txt
[ -f $W/f8/losses.csv ] && med $W/f8/losses.csv >> $R/gpu_b.txt
pack
fi
[ "${NOSHARE:-0}" = 1 ] && { cat $R/gpu_b.txt; exit 0; }
rm -rf $W/b16
python3 -c 'import json,sys; c=json.load(open(sys.argv[1])); c["train"]["share_buffers"]=True; json.dump(c,open(sys.argv[2],"w"))' examples/train/lm_125m.json $W/share.json
timeout 150 $FB train lm --config $W/share.json --data $W/lm --steps 30 --out $W/b16 --backend gpu --no-plot --generate 0 > $R/m125_share.txt 2>&1
echo "125M bf16 share rc $?" >> $R/gpu_b.txt; grep -E "^start-up|^GPU|validation|error|Error" $R/m125_share.txt | head -6 >> $R/gpu_b.txt
[ -f $W/b16/losses.csv ] && med $W/b16/losses.csv >> $R/gpu_b.txt
pack
cat $R/gpu_b.txt
