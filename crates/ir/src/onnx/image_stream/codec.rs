//! The codecs behind [`super`]: headers and pixels through `image` (and `hayro-jpeg2000`).

use std::io::Cursor;
use std::panic::{catch_unwind, AssertUnwindSafe};

use image::{ImageFormat, ImageReader, Limits};

use super::{DecodedImage, PixelFormat, MAX_DECODED_BYTES, MAX_SIDE};

/// The stream's `(height, width)` from its header alone, without decoding the pixels.
pub fn dimensions(encoded: &[u8]) -> Result<(u32, u32), String> {
    let (width, height) = guarded(|| match stream_kind(encoded)? {
        StreamKind::Common(format) => reader(encoded, format)
            .into_dimensions()
            .map_err(|e| format!("cannot read the {format:?} header: {}", one_line(&e))),
        StreamKind::Jpeg2000 => jpeg2000::dimensions(encoded),
    })?;
    check_size(width, height)?;
    Ok((height, width))
}

/// Decodes the stream into `pixel_format`'s channels.
pub fn decode(encoded: &[u8], pixel_format: PixelFormat) -> Result<DecodedImage, String> {
    dimensions(encoded)?;
    let (width, height, rgb) = guarded(|| match stream_kind(encoded)? {
        StreamKind::Common(format) => {
            let image = reader(encoded, format)
                .decode()
                .map_err(|e| format!("cannot decode the {format:?} stream: {}", one_line(&e)))?;
            Ok((image.width(), image.height(), image.to_rgb8().into_raw()))
        }
        StreamKind::Jpeg2000 => jpeg2000::decode_rgb(encoded),
    })?;
    let pixels = match pixel_format {
        PixelFormat::Rgb => rgb,
        PixelFormat::Bgr => rgb
            .chunks_exact(3)
            .flat_map(|p| [p[2], p[1], p[0]])
            .collect(),
        PixelFormat::Grayscale => rgb.chunks_exact(3).map(luma).collect(),
    };
    Ok(DecodedImage {
        height: height as usize,
        width: width as usize,
        channels: pixel_format.channels(),
        pixels,
    })
}

/// Pillow's RGB → L conversion (`ImagingConvert`, ITU-R 601-2: 0.299 R + 0.587 G + 0.114 B)
/// in its 16-bit fixed point, rounded half up, so that gray pixels equal the reference's.
fn luma(rgb: &[u8]) -> u8 {
    let weighted =
        u32::from(rgb[0]) * 19_595 + u32::from(rgb[1]) * 38_470 + u32::from(rgb[2]) * 7_471;
    ((weighted + 0x8000) >> 16) as u8
}

enum StreamKind {
    Common(ImageFormat),
    Jpeg2000,
}

/// The codec, from the stream's magic bytes (ImageDecoder has no format attribute).
fn stream_kind(encoded: &[u8]) -> Result<StreamKind, String> {
    if is_jpeg2000(encoded) {
        return Ok(StreamKind::Jpeg2000);
    }
    match image::guess_format(encoded) {
        Ok(
            format @ (ImageFormat::Jpeg
            | ImageFormat::Png
            | ImageFormat::Bmp
            | ImageFormat::Tiff
            | ImageFormat::WebP
            | ImageFormat::Pnm),
        ) => Ok(format),
        Ok(other) => Err(format!(
            "the stream is {other:?}, which ImageDecoder does not decode (JPEG, PNG, BMP, TIFF, WebP, PNM, JPEG 2000)"
        )),
        Err(_) => Err(format!(
            "the {} bytes are not a JPEG, PNG, BMP, TIFF, WebP, PNM or JPEG 2000 stream",
            encoded.len()
        )),
    }
    .map(StreamKind::Common)
}

/// The JP2 file's signature box, or a raw codestream's SOC and SIZ markers.
fn is_jpeg2000(encoded: &[u8]) -> bool {
    encoded.starts_with(b"\x00\x00\x00\x0cjP  \r\n\x87\n")
        || encoded.starts_with(b"\xff\x4f\xff\x51")
}

fn reader(encoded: &[u8], format: ImageFormat) -> ImageReader<Cursor<&[u8]>> {
    let mut limits = Limits::default();
    limits.max_image_width = Some(MAX_SIDE);
    limits.max_image_height = Some(MAX_SIDE);
    limits.max_alloc = Some(MAX_DECODED_BYTES);
    let mut reader = ImageReader::with_format(Cursor::new(encoded), format);
    reader.limits(limits);
    reader
}

fn check_size(width: u32, height: u32) -> Result<(), String> {
    if width == 0 || height == 0 {
        return Err(format!(
            "the header gives an empty {width} × {height} image"
        ));
    }
    if width > MAX_SIDE || height > MAX_SIDE {
        return Err(format!(
            "the header gives {width} × {height} pixels; sides above {MAX_SIDE} are refused"
        ));
    }
    // Four channels of two bytes: the widest sample layout the codecs decode to before the
    // conversion to 8-bit RGB.
    let decoded_bytes = u64::from(width) * u64::from(height) * 8;
    if decoded_bytes > MAX_DECODED_BYTES {
        return Err(format!(
            "the header gives {width} × {height} pixels, more than the {MAX_DECODED_BYTES} decoded bytes allowed"
        ));
    }
    Ok(())
}

/// A codec's error message on one line (some end theirs with a newline or span several).
fn one_line(error: &dyn std::fmt::Display) -> String {
    error
        .to_string()
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

/// Runs a codec call, turning a panic inside it into an error: the codecs are well tested, but a
/// hostile stream must never take the process down.
fn guarded<T>(decode: impl FnOnce() -> Result<T, String>) -> Result<T, String> {
    catch_unwind(AssertUnwindSafe(decode))
        .unwrap_or_else(|_| Err("the codec failed on a malformed stream".to_string()))
}

#[cfg(feature = "jpeg2000")]
mod jpeg2000 {
    use hayro_jpeg2000::{DecodeSettings, DecoderContext, Image};

    fn open(encoded: &[u8]) -> Result<Image<'_>, String> {
        Image::new(encoded, &DecodeSettings::default())
            .map_err(|e| format!("cannot read the JPEG 2000 header: {}", super::one_line(&e)))
    }

    pub(super) fn dimensions(encoded: &[u8]) -> Result<(u32, u32), String> {
        let image = open(encoded)?;
        Ok((image.width(), image.height()))
    }

    /// 8-bit RGB: gray images spread to three channels, alpha dropped.
    pub(super) fn decode_rgb(encoded: &[u8]) -> Result<(u32, u32, Vec<u8>), String> {
        let image = open(encoded)?;
        let (width, height) = (image.width(), image.height());
        let channels =
            usize::from(image.color_space().num_channels()) + usize::from(image.has_alpha());
        let mut context = DecoderContext::default();
        let decoded = image.decode(&mut context).map_err(|e| {
            format!(
                "cannot decode the JPEG 2000 stream: {}",
                super::one_line(&e)
            )
        })?;
        let samples = decoded.data_u8();
        let rgb = match channels {
            1 | 2 => samples.chunks_exact(channels).flat_map(|p| [p[0]; 3]).collect(),
            3 => samples,
            4 if image.has_alpha() => samples.chunks_exact(4).flat_map(|p| [p[0], p[1], p[2]]).collect(),
            _ => {
                return Err(format!(
                    "the JPEG 2000 stream has {channels} channels in {:?}; ImageDecoder decodes gray and RGB",
                    image.color_space()
                ))
            }
        };
        Ok((width, height, rgb))
    }
}

/// Without feature `jpeg2000`: the stream is recognised and refused with the reason.
#[cfg(not(feature = "jpeg2000"))]
mod jpeg2000 {
    const REFUSAL: &str = "JPEG 2000 streams need pipecut built with feature `jpeg2000` (hayro-jpeg2000, Rust 1.92 or newer)";

    pub(super) fn dimensions(_: &[u8]) -> Result<(u32, u32), String> {
        Err(REFUSAL.to_string())
    }

    pub(super) fn decode_rgb(_: &[u8]) -> Result<(u32, u32, Vec<u8>), String> {
        Err(REFUSAL.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 2 × 3 binary PPM: red, green, blue / white, black, gray.
    const PPM: &[u8] =
        b"P6\n3 2\n255\n\xff\x00\x00\x00\xff\x00\x00\x00\xff\xff\xff\xff\x00\x00\x00\x80\x80\x80";

    /// A PNG header (signature and IHDR) claiming `width × height` 8-bit RGB pixels, with the
    /// IHDR checksum right, and no image data after it.
    fn png_header(width: u32, height: u32) -> Vec<u8> {
        let mut ihdr = b"IHDR".to_vec();
        ihdr.extend(width.to_be_bytes());
        ihdr.extend(height.to_be_bytes());
        ihdr.extend([8, 2, 0, 0, 0]);
        let mut png = b"\x89PNG\r\n\x1a\n".to_vec();
        png.extend(13u32.to_be_bytes());
        png.extend(&ihdr);
        png.extend(crc32(&ihdr).to_be_bytes());
        // An empty IDAT: the decoder reads up to the first data chunk before it reports.
        png.extend(0u32.to_be_bytes());
        png.extend(b"IDAT");
        png.extend(crc32(b"IDAT").to_be_bytes());
        png
    }

    fn crc32(bytes: &[u8]) -> u32 {
        let mut crc = !0u32;
        for &b in bytes {
            crc ^= u32::from(b);
            for _ in 0..8 {
                crc = if crc & 1 == 1 {
                    (crc >> 1) ^ 0xEDB8_8320
                } else {
                    crc >> 1
                };
            }
        }
        !crc
    }

    #[test]
    fn header_gives_height_then_width() {
        assert_eq!(dimensions(PPM).unwrap(), (2, 3));
        assert_eq!(dimensions(&png_header(640, 480)).unwrap(), (480, 640));
    }

    #[test]
    fn forged_huge_header_is_refused_before_allocating() {
        let err = dimensions(&png_header(1 << 30, 1 << 30)).unwrap_err();
        assert!(err.contains("refused") || err.contains("limit"), "{err}");
        let err = decode(&png_header(40_000, 40_000), PixelFormat::Rgb).unwrap_err();
        assert!(err.contains("decoded bytes allowed"), "{err}");
    }

    #[test]
    fn truncated_and_garbage_streams_fail_in_one_line() {
        for cut in 0..PPM.len() {
            if let Err(err) = decode(&PPM[..cut], PixelFormat::Rgb) {
                assert!(!err.contains('\n'), "{err}");
            }
        }
        let err = decode(b"not an image at all", PixelFormat::Rgb).unwrap_err();
        assert!(err.contains("not a JPEG, PNG"), "{err}");
        // Deterministic garbage after each format's magic bytes.
        let mut state = 0x2545_f491_u32;
        for magic in [
            &b"\xff\xd8\xff"[..],
            b"\x89PNG\r\n\x1a\n",
            b"BM",
            b"II*\x00",
            b"RIFF\x00\x00\x00\x00WEBPVP8 ",
            b"P6\n",
        ] {
            for _ in 0..50 {
                let mut stream = magic.to_vec();
                stream.extend((0..200).map(|_| {
                    state ^= state << 13;
                    state ^= state >> 17;
                    state ^= state << 5;
                    state as u8
                }));
                if let Err(err) = decode(&stream, PixelFormat::Grayscale) {
                    assert!(!err.contains('\n'), "{err}");
                }
            }
        }
    }

    /// One 32 × 32 checkerboard as onnx's ImageDecoder cases encode it (fixtures/images/).
    const PNG: &[u8] = include_bytes!("../../../../../fixtures/images/checkerboard.png");
    const JPEG: &[u8] = include_bytes!("../../../../../fixtures/images/checkerboard.jpg");
    const JPEG2000: &[u8] = include_bytes!("../../../../../fixtures/images/checkerboard.jp2");

    #[test]
    fn every_cut_and_corruption_of_real_streams_is_a_one_line_error() {
        let mut state = 0x9e37_79b9_u32;
        for stream in [PNG, JPEG, JPEG2000, PPM] {
            for cut in 0..stream.len() {
                if let Err(err) = decode(&stream[..cut], PixelFormat::Rgb) {
                    assert!(!err.contains('\n'), "{err}");
                }
            }
            for _ in 0..200 {
                let mut corrupted = stream.to_vec();
                for _ in 0..4 {
                    state ^= state << 13;
                    state ^= state >> 17;
                    state ^= state << 5;
                    let at = state as usize % corrupted.len();
                    corrupted[at] = (state >> 8) as u8;
                }
                if let Err(err) = decode(&corrupted, PixelFormat::Rgb) {
                    assert!(!err.contains('\n'), "{err}");
                }
            }
        }
    }

    #[test]
    fn jpeg_decodes_to_the_header_size() {
        assert_eq!(dimensions(JPEG).unwrap(), (32, 32));
        let image = decode(JPEG, PixelFormat::Bgr).unwrap();
        assert_eq!((image.height, image.width, image.channels), (32, 32, 3));
        assert_eq!(image.pixels.len(), 32 * 32 * 3);
    }

    #[cfg(feature = "jpeg2000")]
    #[test]
    fn lossless_jpeg2000_decodes_to_the_pngs_pixels() {
        assert_eq!(dimensions(JPEG2000).unwrap(), (32, 32));
        let png = decode(PNG, PixelFormat::Rgb).unwrap();
        assert_eq!(decode(JPEG2000, PixelFormat::Rgb).unwrap(), png);
    }

    #[cfg(not(feature = "jpeg2000"))]
    #[test]
    fn jpeg2000_names_the_feature_it_needs() {
        let err = decode(JPEG2000, PixelFormat::Rgb).unwrap_err();
        assert!(err.contains("feature `jpeg2000`"), "{err}");
    }

    #[test]
    fn unsupported_formats_are_named() {
        let err = decode(b"GIF89a\x01\x00\x01\x00\x00\x00\x00", PixelFormat::Rgb).unwrap_err();
        assert!(err.contains("Gif"), "{err}");
        assert!(PixelFormat::parse(Some("CMYK")).is_err());
    }
}
