/* packer._jpegwindow: decode one rectangle of a JPEG with the system's libjpeg-turbo, skipping
 * what the library lets a decoder skip outside it (the readers' ``crop=``). Rows above the
 * window: jpeg_skip_scanlines (entropy-decoded, but no inverse DCT, upsampling or colour
 * conversion); columns outside it: jpeg_crop_scanline (the same, per iMCU column); rows below it:
 * not decoded at all (the decode ends after the window's last row). Needs libjpeg-turbo >= 1.5;
 * where it cannot be built, packer decodes whole images and crops them (the same pixels).
 *
 * The columns are widened by one iMCU on each side before cropping, so that the chroma upsampler
 * sees the neighbours a full decode sees; tests/test_crop.py checks that the pixels equal a full
 * decode's (simplejpeg's and OpenCV's, which use libjpeg-turbo with the same defaults).
 * Strict: a libjpeg warning (damaged data) or error ends the decode and the call returns False.
 * Colour spaces other than gray, YCbCr and RGB, and precisions other than 8 bits, return False.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jpeglib.h>

#if !defined(JCS_EXTENSIONS)
#error "libjpeg-turbo (JCS_EXT_RGB) is needed; packer falls back to full decodes without this module"
#endif

#define ROWS_PER_CALL 16

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

static int decode(const unsigned char *data, size_t size, unsigned char *out, JDIMENSION top,
                  JDIMENSION left, JDIMENSION height, JDIMENSION width, int *bad_window)
{
    struct jpeg_decompress_struct cinfo;
    struct guard err;
    unsigned char *volatile row = NULL;
    volatile int ok = 0;

    cinfo.err = jpeg_std_error(&err.pub);
    err.pub.error_exit = stop_on_error;
    err.pub.emit_message = stop_on_warning;
    jpeg_create_decompress(&cinfo);
    if (setjmp(err.jump))
        goto done;
    jpeg_mem_src(&cinfo, (unsigned char *)data, (unsigned long)size);
    jpeg_read_header(&cinfo, TRUE);
    if (cinfo.data_precision != 8 ||
        !(cinfo.jpeg_color_space == JCS_YCbCr || cinfo.jpeg_color_space == JCS_GRAYSCALE ||
          cinfo.jpeg_color_space == JCS_RGB))
        goto done;
    cinfo.out_color_space = JCS_EXT_RGB;
    cinfo.dct_method = JDCT_ISLOW;
    cinfo.do_fancy_upsampling = TRUE;
    jpeg_start_decompress(&cinfo);
    if (cinfo.output_components != 3)
        goto done;
    if ((unsigned long)top + height > cinfo.output_height ||
        (unsigned long)left + width > cinfo.output_width || height == 0 || width == 0) {
        *bad_window = 1;
        goto done;
    }
    {
        JDIMENSION imcu = (JDIMENSION)cinfo.max_h_samp_factor * DCTSIZE;
        JDIMENSION x0 = left > imcu ? left - imcu : 0;
        JDIMENSION x1 = left + width + imcu < cinfo.output_width ? left + width + imcu : cinfo.output_width;
        JDIMENSION xoff = x0, cw = x1 - x0, r;
        size_t shift;
        if (xoff > 0 || cw < cinfo.output_width)
            jpeg_crop_scanline(&cinfo, &xoff, &cw);
        else
            xoff = 0;
        shift = (size_t)(left - xoff) * 3;
        if (top > 0 && jpeg_skip_scanlines(&cinfo, top) != top)
            goto done;
        if (shift == 0 && cinfo.output_width == width) {
            /* no columns to drop: decode straight into the output's rows, many per call */
            JSAMPROW rows[ROWS_PER_CALL];
            for (r = 0; r < height;) {
                JDIMENSION k, n = height - r < ROWS_PER_CALL ? height - r : ROWS_PER_CALL, got;
                for (k = 0; k < n; k++)
                    rows[k] = out + (size_t)(r + k) * width * 3;
                got = jpeg_read_scanlines(&cinfo, rows, n);
                if (got == 0)
                    goto done;
                r += got;
            }
        } else {
            JSAMPROW rows[ROWS_PER_CALL];
            JDIMENSION k;
            size_t stride = (size_t)cinfo.output_width * 3;
            row = (unsigned char *)malloc(stride * ROWS_PER_CALL);
            if (row == NULL)
                goto done;
            for (k = 0; k < ROWS_PER_CALL; k++)
                rows[k] = row + k * stride;
            for (r = 0; r < height;) {
                JDIMENSION n = height - r < ROWS_PER_CALL ? height - r : ROWS_PER_CALL;
                JDIMENSION got = jpeg_read_scanlines(&cinfo, rows, n);
                if (got == 0)
                    goto done;
                for (k = 0; k < got; k++)
                    memcpy(out + (size_t)(r + k) * width * 3, rows[k] + shift, (size_t)width * 3);
                r += got;
            }
        }
        ok = 1;
    }
done:
    free(row);
    jpeg_destroy_decompress(&cinfo);
    return ok;
}

static PyObject *decode_window(PyObject *self, PyObject *args)
{
    Py_buffer src, dst;
    PyObject *target;
    unsigned int top, left;
    int ok, bad_window = 0;

    (void)self;
    if (!PyArg_ParseTuple(args, "y*OII", &src, &target, &top, &left))
        return NULL;
    if (PyObject_GetBuffer(target, &dst, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(&src);
        return NULL;
    }
    if (dst.ndim != 3 || dst.shape[2] != 3 || dst.itemsize != 1) {
        PyBuffer_Release(&src);
        PyBuffer_Release(&dst);
        PyErr_SetString(PyExc_ValueError, "decode_window: out must be a C-contiguous H x W x 3 uint8 buffer");
        return NULL;
    }
    {
        JDIMENSION height = (JDIMENSION)dst.shape[0], width = (JDIMENSION)dst.shape[1];
        Py_BEGIN_ALLOW_THREADS
        ok = decode((const unsigned char *)src.buf, (size_t)src.len, (unsigned char *)dst.buf, top, left,
                    height, width, &bad_window);
        Py_END_ALLOW_THREADS
        if (bad_window)
            PyErr_Format(PyExc_ValueError, "decode_window: the %ux%u window at (%u, %u) is outside the image",
                         height, width, top, left);
    }
    PyBuffer_Release(&src);
    PyBuffer_Release(&dst);
    if (bad_window)
        return NULL;
    return PyBool_FromLong(ok);
}

static PyMethodDef methods[] = {
    {"decode_window", decode_window, METH_VARARGS,
     "decode_window(payload, out, top, left) -> bool: the window of out's H x W at (top, left), RGB"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_jpegwindow", "A JPEG window decoded with libjpeg-turbo, skipping what lies outside it.",
    -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__jpegwindow(void) { return PyModule_Create(&module); }
