"""Media in messages (pure): images, audio and files read from their headers, counted by the
provider family's published rule, described as text, and aged into placeholders.

A content part is media when its ``type`` is ``image_url``, ``input_audio`` or ``file`` (OpenAI's
chat format, which litellm translates for every provider). On ingest each media part is checked
(``check_part``) and gets a ``_media`` object that Recap computes itself (kind, type, name, size,
width and height, the stored copy's content name), whatever the input said under that key. The
bytes are never decoded beyond their header: PNG, JPEG (a scan for the SOF marker), GIF and WebP
(VP8, VP8L, VP8X) give their size in a few bytes, and a remote URL is never fetched.

Counting (``part_tokens``) follows the family of the conversation's model (``image_rule_of``):

- OpenAI: ``detail: low`` is a fixed base; ``high`` (and ``auto``, counted as ``high``, the more
  expensive reading) scales the image to fit 2048 x 2048, then its shortest side down to 768, and
  adds a per-tile cost for each 512-px tile. The base and tile cost depend on the model (85/170
  for GPT-4o and GPT-4.1, 2833/5667 for GPT-4o mini, 75/150 for o1/o3, 70/140 for GPT-5).
- Anthropic: ``ceil(width x height / 750)`` after scaling the long edge down to 1568 px and the
  image down to about 1,600 tokens.
- Gemini: 258 tokens for an image within 384 x 384, else 258 per 768 x 768 tile.
- An image whose size is unknown (a remote URL, a header that cannot be read) is counted as
  ``UNKNOWN_IMAGE_TOKENS``, the upper end of the rules above for one image.
- Audio: ``AUDIO_TOKENS_PER_SECOND`` per second (WAV duration from its header, otherwise from the
  byte size at ``AUDIO_BYTES_PER_SECOND``). Files: ``FILE_TOKENS_PER_PAGE`` per PDF page (pages
  counted from the ``/Type /Page`` objects), otherwise one token per ``FILE_BYTES_PER_TOKEN``
  bytes; a file known only by id counts as ``UNKNOWN_FILE_TOKENS``.

The package is split by job: ``kinds`` (types and constants), ``headers`` (sizes from the first
bytes), ``parts`` (ingest checks and the ``_media`` object), ``pricing`` (tokens by provider rule),
``text`` (labels and placeholders), ``request`` (what is sent and its bytes), ``ageing`` (media aged
into placeholders). Every name is re-exported here: ``from core.counting import media`` and
``media.part_tokens`` work as before.
"""

from __future__ import annotations

from recap.core.counting.media.ageing import (
    BYTES as BYTES,
)
from recap.core.counting.media.ageing import (
    CAP as CAP,
)
from recap.core.counting.media.ageing import (
    RECORDED as RECORDED,
)
from recap.core.counting.media.ageing import (
    TEXT_ONLY as TEXT_ONLY,
)
from recap.core.counting.media.ageing import (
    TURNS as TURNS,
)
from recap.core.counting.media.ageing import (
    AgeingPlan as AgeingPlan,
)
from recap.core.counting.media.ageing import (
    Counter as Counter,
)
from recap.core.counting.media.ageing import (
    Finished as Finished,
)
from recap.core.counting.media.ageing import (
    check_parts as check_parts,
)
from recap.core.counting.media.ageing import (
    finish as finish,
)
from recap.core.counting.media.ageing import (
    plan_ageing as plan_ageing,
)
from recap.core.counting.media.ageing import (
    request_bytes as request_bytes,
)
from recap.core.counting.media.headers import (
    image_size as image_size,
)
from recap.core.counting.media.headers import (
    wav_seconds as wav_seconds,
)
from recap.core.counting.media.kinds import (
    ANTHROPIC as ANTHROPIC,
)
from recap.core.counting.media.kinds import (
    ANTHROPIC_LONG_EDGE as ANTHROPIC_LONG_EDGE,
)
from recap.core.counting.media.kinds import (
    ANTHROPIC_MAX_TOKENS as ANTHROPIC_MAX_TOKENS,
)
from recap.core.counting.media.kinds import (
    ANTHROPIC_PIXELS_PER_TOKEN as ANTHROPIC_PIXELS_PER_TOKEN,
)
from recap.core.counting.media.kinds import (
    AUDIO as AUDIO,
)
from recap.core.counting.media.kinds import (
    AUDIO_BYTES_PER_SECOND as AUDIO_BYTES_PER_SECOND,
)
from recap.core.counting.media.kinds import (
    AUDIO_FORMATS as AUDIO_FORMATS,
)
from recap.core.counting.media.kinds import (
    AUDIO_TOKENS_PER_SECOND as AUDIO_TOKENS_PER_SECOND,
)
from recap.core.counting.media.kinds import (
    DATA_URL_RE as DATA_URL_RE,
)
from recap.core.counting.media.kinds import (
    DEFAULT_FAMILY as DEFAULT_FAMILY,
)
from recap.core.counting.media.kinds import (
    EXTENSIONS as EXTENSIONS,
)
from recap.core.counting.media.kinds import (
    FILE as FILE,
)
from recap.core.counting.media.kinds import (
    FILE_BYTES_PER_TOKEN as FILE_BYTES_PER_TOKEN,
)
from recap.core.counting.media.kinds import (
    FILE_TOKENS_PER_PAGE as FILE_TOKENS_PER_PAGE,
)
from recap.core.counting.media.kinds import (
    FILE_TYPES as FILE_TYPES,
)
from recap.core.counting.media.kinds import (
    GEMINI as GEMINI,
)
from recap.core.counting.media.kinds import (
    GEMINI_SMALL as GEMINI_SMALL,
)
from recap.core.counting.media.kinds import (
    GEMINI_TILE as GEMINI_TILE,
)
from recap.core.counting.media.kinds import (
    GEMINI_TOKENS as GEMINI_TOKENS,
)
from recap.core.counting.media.kinds import (
    HEADER_SCAN_BYTES as HEADER_SCAN_BYTES,
)
from recap.core.counting.media.kinds import (
    IMAGE as IMAGE,
)
from recap.core.counting.media.kinds import (
    IMAGE_TYPES as IMAGE_TYPES,
)
from recap.core.counting.media.kinds import (
    META_KEY as META_KEY,
)
from recap.core.counting.media.kinds import (
    NAME_CHARS as NAME_CHARS,
)
from recap.core.counting.media.kinds import (
    OPENAI as OPENAI,
)
from recap.core.counting.media.kinds import (
    OPENAI_BOX as OPENAI_BOX,
)
from recap.core.counting.media.kinds import (
    OPENAI_DEFAULT_COSTS as OPENAI_DEFAULT_COSTS,
)
from recap.core.counting.media.kinds import (
    OPENAI_SHORT_SIDE as OPENAI_SHORT_SIDE,
)
from recap.core.counting.media.kinds import (
    OPENAI_TILE as OPENAI_TILE,
)
from recap.core.counting.media.kinds import (
    OPENAI_TILE_COSTS as OPENAI_TILE_COSTS,
)
from recap.core.counting.media.kinds import (
    PART_KINDS as PART_KINDS,
)
from recap.core.counting.media.kinds import (
    PDF_PAGE_RE as PDF_PAGE_RE,
)
from recap.core.counting.media.kinds import (
    PLACEHOLDER as PLACEHOLDER,
)
from recap.core.counting.media.kinds import (
    REF_RE as REF_RE,
)
from recap.core.counting.media.kinds import (
    REF_SCHEME as REF_SCHEME,
)
from recap.core.counting.media.kinds import (
    SHORT_DIGEST_CHARS as SHORT_DIGEST_CHARS,
)
from recap.core.counting.media.kinds import (
    UNAVAILABLE as UNAVAILABLE,
)
from recap.core.counting.media.kinds import (
    UNKNOWN_AUDIO_TOKENS as UNKNOWN_AUDIO_TOKENS,
)
from recap.core.counting.media.kinds import (
    UNKNOWN_FILE_TOKENS as UNKNOWN_FILE_TOKENS,
)
from recap.core.counting.media.kinds import (
    UNKNOWN_IMAGE_TOKENS as UNKNOWN_IMAGE_TOKENS,
)
from recap.core.counting.media.kinds import (
    MediaError as MediaError,
)
from recap.core.counting.media.kinds import (
    log as log,
)
from recap.core.counting.media.parts import (
    Checked as Checked,
)
from recap.core.counting.media.parts import (
    check_part as check_part,
)
from recap.core.counting.media.parts import (
    data_of as data_of,
)
from recap.core.counting.media.parts import (
    has_media as has_media,
)
from recap.core.counting.media.parts import (
    kind_of as kind_of,
)
from recap.core.counting.media.parts import (
    meta_of as meta_of,
)
from recap.core.counting.media.parts import (
    parse_data_url as parse_data_url,
)
from recap.core.counting.media.parts import (
    ref_of as ref_of,
)
from recap.core.counting.media.parts import (
    with_data as with_data,
)
from recap.core.counting.media.pricing import (
    anthropic_image_tokens as anthropic_image_tokens,
)
from recap.core.counting.media.pricing import (
    gemini_image_tokens as gemini_image_tokens,
)
from recap.core.counting.media.pricing import (
    image_rule_of as image_rule_of,
)
from recap.core.counting.media.pricing import (
    image_tokens as image_tokens,
)
from recap.core.counting.media.pricing import (
    openai_image_tokens as openai_image_tokens,
)
from recap.core.counting.media.pricing import (
    part_tokens as part_tokens,
)
from recap.core.counting.media.request import (
    Loader as Loader,
)
from recap.core.counting.media.request import (
    MediaPolicy as MediaPolicy,
)
from recap.core.counting.media.request import (
    age_parts as age_parts,
)
from recap.core.counting.media.request import (
    data_field as data_field,
)
from recap.core.counting.media.request import (
    media_positions as media_positions,
)
from recap.core.counting.media.request import (
    sent_bytes as sent_bytes,
)
from recap.core.counting.media.request import (
    strip_meta as strip_meta,
)
from recap.core.counting.media.text import (
    describe as describe,
)
from recap.core.counting.media.text import (
    label as label,
)
from recap.core.counting.media.text import (
    names as names,
)
from recap.core.counting.media.text import (
    parts_text as parts_text,
)
from recap.core.counting.media.text import (
    placeholder as placeholder,
)
from recap.core.counting.media.text import (
    placeholder_part as placeholder_part,
)
from recap.core.counting.media.text import (
    text_of as text_of,
)
