class InputContainer: pass
class OutputContainer: pass
