"""Images: headers, decoding, processing and encoding, the codec table and the crop-window module."""
