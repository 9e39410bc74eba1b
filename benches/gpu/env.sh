# Sourced by the GPU scripts here. NVRTC and cuBLAS from the CUDA toolkit or a Python venv's
# nvidia wheels, linked under /tmp/cudalibs as the lib*.so names cudarc looks for (the wheels'
# other libraries on the path too, for onnxruntime's CUDA provider); DEV, the device profile of
# the GPU; DIMS, each fixture's and real model's dims for one micro-batch.
libs=/tmp/cudalibs; mkdir -p $libs
for name in nvrtc cublas cublasLt nvrtc-builtins; do
  f=$(ls /usr/local/cuda/lib64/lib$name.so* /usr/local/cuda/targets/x86_64-linux/lib/lib$name.so* \
        /opt/torch/.venv/lib/python3*/site-packages/nvidia/*/lib/lib$name.so* 2>/dev/null | grep -v alt | head -1)
  echo "lib$name: $f"
  [ -n "$f" ] && ln -sf "$f" $libs/lib$name.so
done
export LD_LIBRARY_PATH=$libs:/usr/local/cuda/lib64:$LD_LIBRARY_PATH:$(ls -d /opt/torch/.venv/lib/python3*/site-packages/nvidia/*/lib 2>/dev/null | tr '\n' ':')
case "$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)" in
  *H200*) DEV=H200-SXM ;; *A100*) DEV=A100-80GB ;; *) DEV=H100-SXM ;;
esac
echo "device profile: $DEV"
declare -A DIMS=(
 [mlp]="--dim batch=64" [gpt2_tiny]="--dim batch=8 --dim seq=64" [bert_tiny]="--dim batch=8 --dim seq=64"
 [llama_tiny]="--dim batch=8 --dim seq=64" [resnet_tiny]="--dim batch=8"
 [magika_standard_v3_3]="--dim unk__214=16" [ppocr_mobile_v2_cls]="--dim x.0=8 --dim x.2=48 --dim x.3=192"
 [ppocr_v4_det]="--dim p2o.DynamicDimension.0=1 --dim p2o.DynamicDimension.1=256 --dim p2o.DynamicDimension.2=256"
 [ppocr_v4_rec]="--dim p2o.DynamicDimension.0=4 --dim p2o.DynamicDimension.1=320 --dim x.2=48")
