"""The kinds of media part Recap knows, the types each accepts, and the rules' constants."""

from __future__ import annotations

import re

import structlog

from recap.core.errors import InputError

log = structlog.get_logger("recap.core.counting.media")  # one logger for the package, as before


IMAGE, AUDIO, FILE = "image", "audio", "file"


PART_KINDS = {"image_url": IMAGE, "input_audio": AUDIO, "file": FILE}


META_KEY = "_media"  # the key Recap computes on each media part; never taken from input


REF_SCHEME = "recap-media:"  # a stored part's data field says where its bytes went: this + name


REF_RE = re.compile(r"^recap-media:([0-9a-f]{32})$")


IMAGE_TYPES = {"image/png", "image/jpeg", "image/gif", "image/webp"}  # what every vision API takes


AUDIO_FORMATS = {"wav", "mp3", "flac", "ogg", "opus", "aac", "m4a", "webm", "pcm16"}


FILE_TYPES = {"application/pdf", "text/plain", "text/markdown", "text/csv", "application/json"}


EXTENSIONS = {
    "image/png": "png",
    "image/jpeg": "jpg",
    "image/gif": "gif",
    "image/webp": "webp",
    "application/pdf": "pdf",
    "text/plain": "txt",
    "text/markdown": "md",
    "text/csv": "csv",
    "application/json": "json",
}


DATA_URL_RE = re.compile(r"^data:([\w.+-]+/[\w.+-]+)((?:;[\w.+-]+=[^;,]*)*);base64,(.*)$", re.S)


OPENAI, ANTHROPIC, GEMINI = "openai", "anthropic", "gemini"


DEFAULT_FAMILY = OPENAI  # OpenAI-compatible servers are the common case behind a litellm string


# OpenAI, "Images and vision" guide, "Calculating costs": (base, per 512-px tile) by model.
OPENAI_TILE_COSTS: tuple[tuple[str, tuple[int, int]], ...] = (
    ("gpt-4o-mini", (2833, 5667)),
    ("gpt-5", (70, 140)),
    ("o1", (75, 150)),
    ("o3", (75, 150)),
)


OPENAI_DEFAULT_COSTS = (85, 170)  # GPT-4o, GPT-4.1, GPT-4.5 and the guide's worked examples


OPENAI_BOX = 2048  # first fit within 2048 x 2048


OPENAI_SHORT_SIDE = 768  # then the shortest side is scaled down to 768


OPENAI_TILE = 512


ANTHROPIC_LONG_EDGE = 1568  # Anthropic's vision guide: a longer edge is scaled down first


ANTHROPIC_MAX_TOKENS = 1600  # ... as is an image of more than about 1,600 tokens


ANTHROPIC_PIXELS_PER_TOKEN = 750  # tokens = width x height / 750


GEMINI_SMALL = 384  # Gemini: an image within 384 x 384 is one block


GEMINI_TILE = 768  # a larger one is cut into 768 x 768 tiles


GEMINI_TOKENS = 258  # per block or tile


UNKNOWN_IMAGE_TOKENS = 1600  # size unknown: the most one image costs under the rules above


AUDIO_TOKENS_PER_SECOND = 32  # Gemini's published audio rate; OpenAI's audio models are lower


AUDIO_BYTES_PER_SECOND = 16_000  # a compressed format's duration estimated at 128 kbit/s


UNKNOWN_AUDIO_TOKENS = 960  # no data: assumed half a minute


FILE_TOKENS_PER_PAGE = 1_500  # Anthropic's PDF guide: 1,500-3,000 text tokens a page, low end


FILE_BYTES_PER_TOKEN = 4  # a text file: about four bytes per token


UNKNOWN_FILE_TOKENS = 3_000  # a file known by id only: assumed two pages


PDF_PAGE_RE = re.compile(rb"/Type\s*/Page(?![s\w])")


HEADER_SCAN_BYTES = 1 << 20  # a JPEG's SOF marker is found within its first MiB in practice


SHORT_DIGEST_CHARS = 8  # an unnamed part is called by its kind and these digits of its hash


NAME_CHARS = 80  # a media name shown in a placeholder is cut here


PLACEHOLDER = "[{kind}: {label}, removed to save context]"


UNAVAILABLE = "[{kind}: {label}, its stored copy is no longer available]"


_logged: set[str] = set()


class MediaError(InputError):
    """A media part that cannot be stored: malformed, of an unsupported type, or without data."""
