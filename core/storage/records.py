"""The row copies, re-exported from their home on the bottom floor (``core.values.records``)."""

from core.values.records import ROLES as ROLES
from core.values.records import ClearingRec as ClearingRec
from core.values.records import Msg as Msg
from core.values.records import SummaryRec as SummaryRec
