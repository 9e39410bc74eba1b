//! [ImageDecoder](https://onnx.ai/onnx/operators/onnx__ImageDecoder.html) (opset 20): a 1-D
//! uint8 encoded stream to uint8 `[height, width, channels]` pixels. The codecs and the pixel
//! conversions live in [`pipecut_ir::onnx::image_stream`], which shape inference also reads headers
//! with, so a planned size and a decoded one cannot disagree.

use super::context::{input, Ctx, KernelResult, KernelTable};
use std::borrow::Cow;

use crate::tensor::{HostTensor, TensorData};
use pipecut_ir::onnx::image_stream::{self, PixelFormat};

pub(super) fn register(t: &mut KernelTable) {
    t.add(&["ImageDecoder"], image_decoder);
}

fn image_decoder(ctx: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let encoded = input(inputs, 0)?;
    if encoded.rank() != 1 {
        return Err(format!(
            "the encoded stream should be 1-D uint8, found shape {:?}",
            encoded.shape()
        ));
    }
    let bytes = stream_bytes(encoded)?;
    let pixel_format = PixelFormat::parse(Some(&ctx.string("pixel_format", "RGB")))?;
    let image = image_stream::decode(&bytes, pixel_format)?;
    // The decoder's buffer becomes the output as it is: one byte per pixel channel.
    Ok(vec![HostTensor::new(
        vec![image.height, image.width, image.channels],
        TensorData::U8(image.pixels),
    )?])
}

/// The stream's bytes: a uint8 tensor's own, or an int64 tensor's (a stream computed by ops
/// without a byte path) with each element checked to be a byte.
fn stream_bytes(encoded: &HostTensor) -> Result<Cow<'_, [u8]>, String> {
    match encoded.data() {
        TensorData::U8(bytes) => Ok(Cow::Borrowed(bytes)),
        TensorData::I64(values) => values
            .iter()
            .map(|&v| {
                u8::try_from(v).map_err(|_| format!("the encoded stream holds {v}, not a byte"))
            })
            .collect(),
        _ => Err(format!(
            "the encoded stream should be uint8, found {}",
            encoded.dtype()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_util::run;
    use crate::tensor::TensorData;
    use pipecut_ir::graph::Attribute;

    /// A 2 × 3 binary PPM: red, green, blue / white, black, gray.
    const PPM: &[u8] =
        b"P6\n3 2\n255\n\xff\x00\x00\x00\xff\x00\x00\x00\xff\xff\xff\xff\x00\x00\x00\x80\x80\x80";

    fn stream(bytes: &[u8]) -> crate::tensor::HostTensor {
        crate::tensor::HostTensor::new(vec![bytes.len()], TensorData::U8(bytes.to_vec())).unwrap()
    }

    fn decode(bytes: &[u8], pixel_format: &str) -> crate::tensor::HostTensor {
        let format = Attribute::String(pixel_format.to_string());
        run(
            "ImageDecoder",
            vec![("pixel_format", format)],
            &[&stream(bytes)],
        )
        .remove(0)
    }

    #[test]
    fn rgb_and_bgr_order_the_channels() {
        let rgb = decode(PPM, "RGB");
        assert_eq!(rgb.shape(), &[2, 3, 3]);
        assert_eq!(rgb.data().byte_size(), 18, "one byte per pixel channel");
        assert_eq!(&rgb.to_i64_vec()[..6], &[255, 0, 0, 0, 255, 0]);
        let bgr = decode(PPM, "BGR");
        assert_eq!(&bgr.to_i64_vec()[..6], &[0, 0, 255, 0, 255, 0]);
    }

    #[test]
    fn grayscale_is_pillows_luma() {
        let gray = decode(PPM, "Grayscale");
        assert_eq!(gray.shape(), &[2, 3, 1]);
        // 0.299·255, 0.587·255, 0.114·255 rounded; white, black and gray kept.
        assert_eq!(gray.to_i64_vec(), vec![76, 150, 29, 255, 0, 128]);
    }
}
