//! [ImageDecoder](https://onnx.ai/onnx/operators/onnx__ImageDecoder.html) (opset 20): a 1-D
//! uint8 encoded stream to uint8 `[height, width, channels]` pixels. The codecs and the pixel
//! conversions live in [`pipecut_ir::onnx::image_stream`], which shape inference also reads headers
//! with, so a planned size and a decoded one cannot disagree.

use super::context::{input, Ctx, KernelResult, KernelTable};
use crate::tensor::{try_collect, HostTensor, TensorData};
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
    // The runtime holds uint8 as int64 (see `crate::tensor`).
    let pixels = try_collect(
        image.pixels.len(),
        image.pixels.iter().map(|&p| i64::from(p)),
    )?;
    Ok(vec![HostTensor::new(
        vec![image.height, image.width, image.channels],
        TensorData::I64(pixels),
    )?])
}

/// The stream's bytes; the runtime widens uint8 to int64, so each element is checked to be one.
fn stream_bytes(encoded: &HostTensor) -> Result<Vec<u8>, String> {
    let TensorData::I64(values) = encoded.data() else {
        return Err(format!(
            "the encoded stream should be uint8, found {:?}",
            encoded.dtype()
        ));
    };
    values
        .iter()
        .map(|&v| u8::try_from(v).map_err(|_| format!("the encoded stream holds {v}, not a byte")))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{i, run};
    use pipecut_ir::graph::Attribute;

    /// A 2 × 3 binary PPM: red, green, blue / white, black, gray.
    const PPM: &[u8] =
        b"P6\n3 2\n255\n\xff\x00\x00\x00\xff\x00\x00\x00\xff\xff\xff\xff\x00\x00\x00\x80\x80\x80";

    fn stream(bytes: &[u8]) -> crate::tensor::HostTensor {
        let values: Vec<i64> = bytes.iter().map(|&b| i64::from(b)).collect();
        i(&[values.len()], &values)
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
