/* packer.images._jpegwindow: decode one rectangle of a JPEG with the system's libjpeg-turbo, skipping
 * what the library lets a decoder skip outside it (the readers' ``crop=``). Rows above the
 * window: jpeg_skip_scanlines (entropy-decoded, but no inverse DCT, upsampling or colour
 * conversion); columns outside it: jpeg_crop_scanline (the same, per iMCU column); rows below it:
 * not decoded at all (the decode ends after the window's last row). Builds with libjpeg-turbo >= 1.5;
 * packer uses it only when built against the version its pixels were checked with or newer
 * (packer.images.imageproc.WINDOW_DECODER_MINIMUM) and only for Huffman-coded frames (SOF0-SOF2); where
 * it is not used, packer decodes whole images and crops them (the same pixels).
 *
 * The columns are widened by one iMCU on each side before cropping, so that the chroma upsampler
 * sees the neighbours a full decode sees; tests/datasets/test_crop.py checks that the pixels equal a full
 * decode's (simplejpeg's and OpenCV's, which use libjpeg-turbo with the same defaults).
 * With a scale of 2, 4 or 8 the image is decoded at 1/scale of its size (libjpeg-turbo's reduced-size
 * inverse DCT, scale_num / scale_denom = 1 / scale) and the window is given in the scaled image's
 * pixels: the pixels are those of a whole scaled decode (TurboJPEG's, OpenCV's IMREAD_REDUCED_*) cut
 * to the window, as tests/datasets/test_reduced.py checks.
 * Strict: a libjpeg warning (damaged data) or error ends the decode and the call returns None.
 * Colour spaces other than gray, YCbCr and RGB, precisions other than 8 bits and arithmetic-coded
 * JPEGs (whose damage libjpeg does not warn about) return None. The module's ``libjpeg_turbo``
 * attribute is the libjpeg-turbo version it was built against ("2.1.5"), for packer to decide
 * whether to use it.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <setjmp.h>
#include <stdio.h>

#include <jpeglib.h>

#if !defined(JCS_EXTENSIONS)
#error "libjpeg-turbo (JCS_EXT_RGB) is needed; packer falls back to full decodes without this module"
#endif

#define ROWS_PER_CALL 16

#define TEXT(x) #x
#define VERSION_TEXT(x) TEXT(x)
#if defined(LIBJPEG_TURBO_VERSION)
#define BUILT_AGAINST VERSION_TEXT(LIBJPEG_TURBO_VERSION)
#else
#define BUILT_AGAINST ""
#endif

struct guard {
    struct jpeg_error_mgr pub;
    jmp_buf jump;
};

static void stop_on_error(j_common_ptr cinfo) { longjmp(((struct guard *)cinfo->err)->jump, 1); }

static void stop_on_warning(j_common_ptr cinfo, int level)
{
    if (level < 0)
        longjmp(((struct guard *)cinfo->err)->jump, 1);
}

/* Decode rows top .. top + height of the columns around left .. left + width into out, a buffer
 * of height rows of out_cols RGB pixels each: row r of the decoded region starts at
 * out + r * out_cols * 3, its column 0 being image column left - *shift. Returns 1, 0 where the
 * payload must be decoded whole instead, and sets *bad_window for a window outside the image or
 * a region wider than out_cols (the caller makes out_cols >= width + 3 iMCUs, or the image's). */
static int decode(const unsigned char *data, size_t size, unsigned char *out, JDIMENSION out_cols,
                  JDIMENSION top, JDIMENSION left, JDIMENSION height, JDIMENSION width,
                  unsigned int scale, JDIMENSION *shift, int *bad_window)
{
    struct jpeg_decompress_struct cinfo;
    struct guard err;
    volatile int ok = 0;

    cinfo.err = jpeg_std_error(&err.pub);
    err.pub.error_exit = stop_on_error;
    err.pub.emit_message = stop_on_warning;
    jpeg_create_decompress(&cinfo);
    if (setjmp(err.jump))
        goto done;
    jpeg_mem_src(&cinfo, (unsigned char *)data, (unsigned long)size);
    jpeg_read_header(&cinfo, TRUE);
    if (cinfo.data_precision != 8 || cinfo.arith_code ||
        !(cinfo.jpeg_color_space == JCS_YCbCr || cinfo.jpeg_color_space == JCS_GRAYSCALE ||
          cinfo.jpeg_color_space == JCS_RGB))
        goto done;
    cinfo.out_color_space = JCS_EXT_RGB;
    cinfo.dct_method = JDCT_ISLOW;
    cinfo.do_fancy_upsampling = TRUE;
    cinfo.scale_num = 1;
    cinfo.scale_denom = scale;
    jpeg_start_decompress(&cinfo);
    if (cinfo.output_components != 3)
        goto done;
    if ((unsigned long)top + height > cinfo.output_height ||
        (unsigned long)left + width > cinfo.output_width || height == 0 || width == 0) {
        *bad_window = 1;
        goto done;
    }
    {
        /* one iMCU of margin each side, so the upsampler's neighbours are those of a full decode (a
         * full-size iMCU: at a reduced scale that is more than one scaled iMCU, which is enough) */
        JDIMENSION imcu = (JDIMENSION)cinfo.max_h_samp_factor * DCTSIZE;
        JDIMENSION x0 = left > imcu ? left - imcu : 0;
        JDIMENSION x1 = left + width + imcu < cinfo.output_width ? left + width + imcu : cinfo.output_width;
        JDIMENSION xoff = x0, cw = x1 - x0, r;
        JSAMPROW rows[ROWS_PER_CALL];
        if (xoff > 0 || cw < cinfo.output_width)
            jpeg_crop_scanline(&cinfo, &xoff, &cw);
        else
            xoff = 0;
        if (cinfo.output_width > out_cols) {
            *bad_window = 1;
            goto done;
        }
        *shift = left - xoff;
        if (top > 0 && jpeg_skip_scanlines(&cinfo, top) != top)
            goto done;
        /* straight into the caller's rows (no copy: the colour conversion's stores are the only
         * writes to that memory), many rows per call */
        for (r = 0; r < height;) {
            JDIMENSION k, n = height - r < ROWS_PER_CALL ? height - r : ROWS_PER_CALL, got;
            for (k = 0; k < n; k++)
                rows[k] = out + (size_t)(r + k) * out_cols * 3;
            got = jpeg_read_scanlines(&cinfo, rows, n);
            if (got == 0)
                goto done;
            r += got;
        }
        ok = 1;
    }
done:
    jpeg_destroy_decompress(&cinfo);
    return ok;
}

static PyObject *decode_window(PyObject *self, PyObject *args)
{
    Py_buffer src, dst;
    PyObject *target;
    unsigned int top, left, width, scale = 1;
    JDIMENSION shift = 0;
    int ok, bad_window = 0;

    (void)self;
    if (!PyArg_ParseTuple(args, "y*OIII|I", &src, &target, &top, &left, &width, &scale))
        return NULL;
    if (scale != 1 && scale != 2 && scale != 4 && scale != 8) {
        PyBuffer_Release(&src);
        PyErr_Format(PyExc_ValueError, "decode_window: scale must be 1, 2, 4 or 8, not %u", scale);
        return NULL;
    }
    if (PyObject_GetBuffer(target, &dst, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(&src);
        return NULL;
    }
    if (dst.ndim != 3 || dst.shape[2] != 3 || dst.itemsize != 1) {
        PyBuffer_Release(&src);
        PyBuffer_Release(&dst);
        PyErr_SetString(PyExc_ValueError, "decode_window: out must be a C-contiguous H x C x 3 uint8 buffer");
        return NULL;
    }
    {
        JDIMENSION height = (JDIMENSION)dst.shape[0], cols = (JDIMENSION)dst.shape[1];
        Py_BEGIN_ALLOW_THREADS
        ok = decode((const unsigned char *)src.buf, (size_t)src.len, (unsigned char *)dst.buf, cols, top, left,
                    height, width, scale, &shift, &bad_window);
        Py_END_ALLOW_THREADS
        if (bad_window)
            PyErr_Format(PyExc_ValueError, "decode_window: the %ux%u window at (%u, %u) is outside the image or "
                         "wider than out's %u columns", height, width, top, left, cols);
    }
    PyBuffer_Release(&src);
    PyBuffer_Release(&dst);
    if (bad_window)
        return NULL;
    if (!ok)
        Py_RETURN_NONE;
    return PyLong_FromUnsignedLong(shift);
}

static PyMethodDef methods[] = {
    {"decode_window", decode_window, METH_VARARGS,
     "decode_window(payload, out, top, left, width, scale=1) -> shift or None: rows top .. top + H of the\n"
     "columns around left .. left + width, RGB, into out (H x C x 3 uint8, C >= width + 96 or the image's\n"
     "width); the window is out[:, shift:shift + width]. scale 2, 4 or 8: the image decoded at 1/scale of\n"
     "its size (libjpeg-turbo's reduced-size IDCT), the window in its pixels. None: decode the payload\n"
     "whole instead (damaged, CMYK, ...)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_jpegwindow", "A JPEG window decoded with libjpeg-turbo, skipping what lies outside it.",
    -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__jpegwindow(void)
{
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddStringConstant(m, "libjpeg_turbo", BUILT_AGAINST) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
